//! What the running kernel offers eBPF, read once at start: its version
//! and the helpers its verifier knows (BTF's `enum bpf_func_id` lists every
//! helper the kernel was built with), so that each hook loads the program
//! variant the kernel takes and a refusal names the kernel that would not
//! refuse.

use super::btf::Btf;

/// The helpers shmtrace's programs call, by id, with the first kernel that
/// has each (include/uapi/linux/bpf.h).
pub const HELPERS: &[(u32, &str, &str)] = &[
    (5, "bpf_ktime_get_ns", "4.1"),
    (14, "bpf_get_current_pid_tgid", "4.2"),
    (16, "bpf_get_current_comm", "4.2"),
    (35, "bpf_get_current_task", "4.8"),
    (80, "bpf_get_current_cgroup_id", "4.18"),
    (112, "bpf_probe_read_user", "5.5"),
    (113, "bpf_probe_read_kernel", "5.5"),
    (114, "bpf_probe_read_user_str", "5.5"),
    (115, "bpf_probe_read_kernel_str", "5.5"),
    (131, "bpf_ringbuf_reserve", "5.8"),
    (132, "bpf_ringbuf_submit", "5.8"),
    (158, "bpf_get_current_task_btf", "5.11"),
    (175, "bpf_task_pt_regs", "5.15"),
];

/// The oldest kernel every required hook loads on (ring buffers: 5.8;
/// BTF-typed raw tracepoints and the probe_read_kernel family: 5.5).
pub const FLOOR: &str = "5.10";

#[derive(Clone, Debug)]
pub struct Kernel {
    /// `uname -r`.
    pub release: String,
    /// (major, minor) parsed from it; (0, 0) when it does not parse.
    pub version: (u32, u32),
    /// bpf_get_current_task_btf and bpf_task_pt_regs (5.15+): syscall
    /// arguments read from a BTF-typed pt_regs; without them, from the
    /// task's stack.
    pub task_pt_regs: bool,
}

impl Kernel {
    pub fn detect(btf: &Btf) -> Self {
        let release = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        // SHMTRACE_SYSCALL_ARGS=stack takes the pre-5.15 way on any kernel:
        // how the suite tests it on this machine's.
        let forced = std::env::var_os("SHMTRACE_SYSCALL_ARGS").is_some_and(|v| v == "stack");
        Self::new(
            release,
            !forced
                && btf.enum_value("BPF_FUNC_get_current_task_btf").is_some()
                && btf.enum_value("BPF_FUNC_task_pt_regs").is_some(),
        )
    }

    pub fn new(release: String, task_pt_regs: bool) -> Self {
        let version = parse_version(&release);
        Self {
            release,
            version,
            task_pt_regs,
        }
    }

    /// Whether BPF maps are charged to RLIMIT_MEMLOCK (before 5.11; since
    /// then to the memory cgroup).
    pub fn memlock_charged(&self) -> bool {
        self.version != (0, 0) && self.version < (5, 11)
    }
}

fn parse_version(release: &str) -> (u32, u32) {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    match (
        parts.next().and_then(|p| p.parse().ok()),
        parts.next().and_then(|p| p.parse().ok()),
    ) {
        (Some(a), Some(b)) => (a, b),
        _ => (0, 0),
    }
}

/// A verifier log's "invalid func unknown#N" or "unknown func NAME#N", as
/// the helper it names and the first kernel that has it.
pub fn missing_helper(verifier_log: &str) -> Option<String> {
    let at = verifier_log.find("func ")?;
    let tail = &verifier_log[at..];
    let hash = tail.find('#')?;
    let id: u32 = tail[hash + 1..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .ok()?;
    let (name, since) = HELPERS
        .iter()
        .find(|(i, _, _)| *i == id)
        .map(|(_, n, s)| (*n, *s))?;
    Some(format!(
        "this kernel lacks helper {id} ({name}), which kernels from {since} on have"
    ))
}

/// Raises RLIMIT_MEMLOCK where BPF maps are charged to it; a note when it
/// cannot be raised (no CAP_SYS_RESOURCE) and the maps may then not fit.
pub fn raise_memlock(kernel: &Kernel) -> Option<String> {
    if !kernel.memlock_charged() {
        return None;
    }
    let inf = nix::sys::resource::RLIM_INFINITY;
    match nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK, inf, inf) {
        Ok(()) => None,
        Err(e) => Some(format!(
            "kernel {} charges BPF maps to RLIMIT_MEMLOCK and it cannot be raised ({e}): \
             if loading fails, run with CAP_SYS_RESOURCE or `ulimit -l unlimited`",
            kernel.release
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_memlock() {
        assert_eq!(
            Kernel::new("5.10.0-32-amd64".into(), false).version,
            (5, 10)
        );
        assert_eq!(Kernel::new("6.18.1".into(), true).version, (6, 18));
        assert_eq!(Kernel::new("weird".into(), true).version, (0, 0));
        assert!(Kernel::new("5.10.0-32-amd64".into(), false).memlock_charged());
        assert!(!Kernel::new("6.1.0-57-amd64".into(), true).memlock_charged());
        assert!(!Kernel::new("weird".into(), true).memlock_charged());
    }

    #[test]
    fn names_the_helper_a_verifier_refused() {
        let log = "0: (85) call unknown#158\ninvalid func unknown#158\nprocessed 1 insns";
        assert_eq!(
            missing_helper(log).as_deref(),
            Some(
                "this kernel lacks helper 158 (bpf_get_current_task_btf), which kernels from 5.11 on have"
            )
        );
        assert!(missing_helper("R1 invalid mem access 'scalar'").is_none());
        assert!(missing_helper("invalid func unknown#9999").is_none());
    }
}
