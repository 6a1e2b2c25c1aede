//! The timeline kept as evidence: the last events on each tmpfs mount (shown
//! with the first failure there), and how many events of each kind came.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::event::Dev;

/// Events kept per mount.
const RECENT: usize = 8;

#[derive(Default)]
pub struct Evidence {
    recent: HashMap<Dev, VecDeque<String>>,
    events_seen: u64,
    by_kind: BTreeMap<&'static str, u64>,
}

impl Evidence {
    /// Events applied, in all.
    pub fn events_seen(&self) -> u64 {
        self.events_seen
    }

    /// Events applied, by name.
    pub fn by_kind(&self) -> &BTreeMap<&'static str, u64> {
        &self.by_kind
    }

    pub fn counted(&mut self, kind: &'static str) {
        self.events_seen += 1;
        *self.by_kind.entry(kind).or_default() += 1;
    }

    /// One line about an event on mount `dev`; the oldest goes past RECENT.
    pub fn noted(&mut self, dev: Dev, line: String) {
        let q = self.recent.entry(dev).or_default();
        if q.len() >= RECENT {
            q.pop_front();
        }
        q.push_back(line);
    }

    pub fn recent_on(&self, dev: Dev) -> Vec<String> {
        self.recent
            .get(&dev)
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn forget_dev(&mut self, dev: Dev) {
        self.recent.remove(&dev);
    }
}

/// Libraries that tell who uses shared memory, by the file name a process
/// maps (`/proc/PID/maps`): (prefix of the name, what it is).
const LIBRARIES: &[(&str, &str)] = &[
    ("libtorch", "libtorch"),
    ("libnccl", "libnccl"),
    ("libcudart", "libcudart"),
    ("libcuda.so", "libcuda"),
    ("_raylet", "ray"),
];

/// The known libraries among a process's mapped file names, once each, in
/// [`LIBRARIES`] order.
pub fn libraries<'a>(names: impl Iterator<Item = &'a str>) -> Vec<&'static str> {
    let mut found = [false; LIBRARIES.len()];
    for n in names {
        if let Some(i) = LIBRARIES.iter().position(|(p, _)| n.starts_with(p)) {
            found[i] = true;
        }
    }
    LIBRARIES
        .iter()
        .zip(found)
        .filter(|(_, f)| *f)
        .map(|((_, what), _)| *what)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_are_named_once_each() {
        let maps = [
            "libc.so.6",
            "libtorch_cpu.so",
            "libtorch_python.so",
            "libcudart.so.13",
            "_raylet.so",
            "libnccl.so.2",
        ];
        assert_eq!(
            libraries(maps.into_iter()),
            ["libtorch", "libnccl", "libcudart", "ray"]
        );
        assert!(libraries(["python3.11", "libcuda_fake"].into_iter()).is_empty());
    }

    #[test]
    fn keeps_the_last_lines_per_mount() {
        let mut e = Evidence::default();
        for i in 0..12 {
            e.noted(Dev(1), format!("line {i}"));
        }
        e.noted(Dev(2), "other".into());
        let r = e.recent_on(Dev(1));
        assert_eq!(r.len(), RECENT);
        assert_eq!(r.first().map(String::as_str), Some("line 4"));
        assert_eq!(e.recent_on(Dev(2)), vec!["other".to_string()]);
        e.counted("fork");
        e.counted("fork");
        assert_eq!((e.events_seen, e.by_kind["fork"]), (2, 2));
    }
}
