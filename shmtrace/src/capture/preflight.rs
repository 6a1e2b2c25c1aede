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
         --cap-add BPF,PERFMON,SYS_PTRACE (and SYS_ADMIN for `run --shm-size`).",
        missing.join(", ")
    )
}

pub fn check_btf() -> Result<()> {
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        bail!(
            "/sys/kernel/btf/vmlinux is missing: this kernel was built without BTF \
             (CONFIG_DEBUG_INFO_BTF=y). shmtrace reads kernel struct offsets from it; \
             use a distribution kernel from 5.15 on, which all ship BTF."
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
