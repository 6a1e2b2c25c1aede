//! Checks before loading anything, each failing with what to do about it:
//! privileges, BTF, tracefs.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

const CAP_SYS_ADMIN: u32 = 21;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Effective capability bits of this process.
pub fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

pub fn has_cap(caps: u64, cap: u32) -> bool {
    caps & (1 << cap) != 0
}

/// Root, or the capabilities loading and attaching need.
pub fn check_privileges() -> Result<()> {
    let caps = effective_caps();
    let admin = has_cap(caps, CAP_SYS_ADMIN);
    let mut missing = Vec::new();
    if !admin && !has_cap(caps, CAP_BPF) {
        missing.push("CAP_BPF (load eBPF programs and maps)");
    }
    if !admin && !has_cap(caps, CAP_PERFMON) {
        missing.push("CAP_PERFMON (attach to tracepoints, read kernel memory)");
    }
    if !has_cap(caps, CAP_SYS_PTRACE) {
        missing.push("CAP_SYS_PTRACE (read other processes' /proc maps and fds)");
    }
    if missing.is_empty() {
        return Ok(());
    }
    let who = if nix::unistd::geteuid().is_root() {
        "running as root but without"
    } else {
        "not running as root, and without"
    };
    bail!(
        "shmtrace is {who}: {}.\n  Run it with sudo (sudo shmtrace ...), or in a container give it \
         --cap-add BPF,PERFMON,SYS_PTRACE,SYS_ADMIN (SYS_ADMIN: setns into pods' mount namespaces, `run --shm-size`, and BPF maps on kernels that want it; see deploy/daemonset.yaml).",
        missing.join(", ")
    )
}

pub fn check_btf() -> Result<()> {
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        bail!(
            "/sys/kernel/btf/vmlinux is missing: this kernel was built without BTF \
             (CONFIG_DEBUG_INFO_BTF=y). shmtrace reads kernel struct offsets from it; \
             use a distribution kernel from 5.10 on that ships BTF (Debian 11+, Ubuntu 20.10+, RHEL 8.2+, Amazon Linux 2's 5.10)."
        );
    }
    Ok(())
}

/// Where tracefs is, mounting it at /sys/kernel/tracing when nothing is.
/// Returns the path and whether shmtrace mounted it.
pub fn ensure_tracefs() -> Result<(PathBuf, bool)> {
    for p in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if Path::new(p).join("events").is_dir() {
            return Ok((PathBuf::from(p), false));
        }
    }
    let target = Path::new("/sys/kernel/tracing");
    match nix::mount::mount(
        Some("nodev"),
        target,
        Some("tracefs"),
        nix::mount::MsFlags::MS_NOSUID
            | nix::mount::MsFlags::MS_NODEV
            | nix::mount::MsFlags::MS_NOEXEC,
        None::<&str>,
    ) {
        Ok(()) if target.join("events").is_dir() => Ok((target.to_path_buf(), true)),
        Ok(()) => bail!(
            "mounted tracefs at {} but it has no events/ directory",
            target.display()
        ),
        Err(e) => bail!(
            "tracefs is not mounted and mounting it failed ({e}).\n  Mount it yourself: \
             sudo mount -t tracefs nodev /sys/kernel/tracing\n  (in a container: bind-mount the \
             host's /sys/kernel/tracing)"
        ),
    }
}

/// Inode of the initial PID namespace (PROC_PID_INIT_INO): the host's.
const INIT_PID_NS: u64 = 0xEFFF_FFFC;

/// Where shmtrace sits among PID namespaces. Kernel events carry host pids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PidView {
    /// The host's PID namespace: pids in events are pids in /proc.
    Host,
    /// A namespace of its own (a container without hostPID). `host_pid`:
    /// its own pid as the kernel reports it, when /proc tells.
    Child { host_pid: Option<u32> },
}

impl PidView {
    pub fn detect() -> Self {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata("/proc/self/ns/pid") {
            Ok(m) if m.ino() != INIT_PID_NS => {
                // NSpid lists the pid from the /proc mount's namespace down:
                // with more than one, the first is the outer one.
                let outer = std::fs::read_to_string("/proc/self/status")
                    .ok()
                    .and_then(|s| {
                        let f: Vec<u32> = s
                            .lines()
                            .find_map(|l| l.strip_prefix("NSpid:"))?
                            .split_whitespace()
                            .filter_map(|v| v.parse().ok())
                            .collect();
                        (f.len() > 1).then(|| f[0])
                    });
                PidView::Child { host_pid: outer }
            }
            _ => PidView::Host,
        }
    }

    /// shmtrace's pid as the kernel's events name it (0: unknown).
    pub fn self_tgid(self) -> u32 {
        match self {
            PidView::Host => std::process::id(),
            PidView::Child { host_pid } => host_pid.unwrap_or(0),
        }
    }

    /// What the user should know, said plainly.
    pub fn note(self) -> Option<String> {
        match self {
            PidView::Host => None,
            PidView::Child { host_pid } => Some(format!(
                "shmtrace runs in a PID namespace of its own, not the host's: the kernel reports host pids, which this /proc does not show, so command lines, fds, mappings and containers of processes outside it are not visible{} (run it with hostPID: true in Kubernetes, --pid=host with docker or podman)",
                if host_pid.is_none() {
                    ", and its own events cannot be told apart"
                } else {
                    ""
                }
            )),
        }
    }
}
