//! Which CUDA libraries get the CUDA IPC uretprobes: those mapped by the
//! processes looked at, at most 32 a second in turn. With `run` and `--pid`
//! every traced process is looked at; node-wide only those that use shared
//! memory (each look is a /proc/PID/maps read, so not every process of the
//! node).

use crate::{
    capture::Tracer,
    host::{Host, procfs::map_file},
};

/// Processes looked at per tick.
const PER_TURN: usize = 32;

#[derive(Default)]
pub struct CudaWatch {
    /// Where the last turn stopped (pids in turn).
    cursor: u32,
}

impl CudaWatch {
    /// The next pids to look at, after the last turn's, wrapping round.
    pub fn turn(&mut self, mut pids: Vec<u32>) -> Vec<u32> {
        pids.sort_unstable();
        let start = pids.partition_point(|&p| p <= self.cursor);
        let turn: Vec<u32> = pids[start..]
            .iter()
            .chain(&pids[..start])
            .take(PER_TURN)
            .copied()
            .collect();
        self.cursor = turn.last().copied().unwrap_or(0);
        turn
    }

    /// Attaches the uretprobes to each CUDA library the turn's processes map.
    pub fn look(&mut self, pids: Vec<u32>, host: &dyn Host, tracer: &mut Tracer) {
        for pid in self.turn(pids) {
            for m in host.maps(pid) {
                let Some(name) = m.name.as_deref() else {
                    continue;
                };
                if !is_cuda_library(name) {
                    continue;
                }
                // The very file mapped, whatever the process's mount
                // namespace: no path it controls is followed.
                let link = std::path::PathBuf::from(map_file(pid, m.start, m.end));
                match tracer.attach_cuda(&link, name, (m.dev.0 as u64, m.ino)) {
                    Ok(true) => tracer.notes.push(format!(
                        "CUDA IPC calls watched in {name} (mapped by pid {pid})"
                    )),
                    Ok(false) => {}
                    Err(e) => tracer.notes.push(format!(
                        "cannot watch CUDA IPC calls in {name} of pid {pid}: {e:#}"
                    )),
                }
            }
        }
    }
}

/// The CUDA runtime (cudaIpc*) or driver (cuIpc*) library.
fn is_cuda_library(name: &str) -> bool {
    name.starts_with("libcudart.so") || name.starts_with("libcuda.so")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_go_round_the_pids_32_at_a_time() {
        let mut w = CudaWatch::default();
        let pids: Vec<u32> = (1..=40).rev().collect();
        assert_eq!(w.turn(pids.clone()), (1..=32).collect::<Vec<_>>());
        let second = w.turn(pids.clone());
        assert_eq!(second[..8], (33..=40).collect::<Vec<_>>()[..]);
        assert_eq!(second[8..], (1..=24).collect::<Vec<_>>()[..]);
        assert!(w.turn(Vec::new()).is_empty());
    }

    #[test]
    fn only_cuda_runtime_and_driver_libraries() {
        assert!(is_cuda_library("libcudart.so.13"));
        assert!(is_cuda_library("libcuda.so.1"));
        assert!(!is_cuda_library("libcudnn.so.9"));
        assert!(!is_cuda_library("libtorch_cuda.so"));
    }
}
