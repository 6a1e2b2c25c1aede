//! `shmtrace doctor`: what this machine and namespace support and hold,
//! checked for real (each hook is loaded and attached, then released).

use std::fmt::Write as _;

use anyhow::Result;

use crate::{
    capture::{Tracer, preflight},
    host::procfs::statfs_path,
    units::human_bytes,
};

pub async fn doctor() -> Result<i32> {
    let mut s = String::new();
    let mut problems = 0;
    let uname = nix::sys::utsname::uname()?;
    let _ = writeln!(
        s,
        "kernel       {} ({})",
        uname.release().to_string_lossy(),
        uname.machine().to_string_lossy()
    );
    match std::fs::metadata("/sys/kernel/btf/vmlinux") {
        Ok(m) => {
            let _ = writeln!(
                s,
                "BTF          /sys/kernel/btf/vmlinux ({})",
                human_bytes(m.len())
            );
        }
        Err(_) => {
            problems += 1;
            let _ = writeln!(
                s,
                "BTF          MISSING: shmtrace needs a kernel built with CONFIG_DEBUG_INFO_BTF=y"
            );
        }
    }
    let caps = preflight::effective_caps();
    let cap = |n: u32, name: &str| {
        format!(
            "{name} {}",
            if preflight::has_cap(caps, n) {
                "yes"
            } else {
                "no"
            }
        )
    };
    let _ = writeln!(
        s,
        "privileges   euid {}; {}, {}, {}, {}",
        nix::unistd::geteuid(),
        cap(39, "CAP_BPF"),
        cap(38, "CAP_PERFMON"),
        cap(19, "CAP_SYS_PTRACE"),
        cap(21, "CAP_SYS_ADMIN")
    );
    let pids = preflight::PidView::detect();
    let _ = writeln!(
        s,
        "pid ns       {}",
        match pids.note() {
            None => "the host's: every process is visible".to_string(),
            Some(n) => n,
        }
    );
    let tracefs_before = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .into_iter()
        .find(|p| std::path::Path::new(p).join("events").is_dir());

    match Tracer::start(false, None) {
        Ok(mut t) => {
            let _ = writeln!(
                s,
                "tracefs      {}",
                match tracefs_before {
                    Some(p) => format!("mounted at {p}"),
                    None => "was not mounted; shmtrace mounted it at /sys/kernel/tracing (it does so at every start)".into(),
                }
            );
            let _ = writeln!(
                s,
                "hooks        (loaded and attached for real, then released)"
            );
            for (name, err) in &t.hooks {
                match err {
                    None => {
                        let _ = writeln!(s, "  {name:<38} ok");
                    }
                    Some(e) => {
                        let _ = writeln!(
                            s,
                            "  {name:<38} REFUSED: {}",
                            e.lines().next().unwrap_or("")
                        );
                    }
                }
            }
            let (kprobe, fentry) = t.probe_extras();
            let extra = |r: &Result<()>| match r {
                Ok(()) => "available".to_string(),
                Err(e) => format!(
                    "unavailable ({})",
                    format!("{e:#}").lines().next().unwrap_or("")
                ),
            };
            let _ = writeln!(s, "extras       kprobes: {}", extra(&kprobe));
            let _ = writeln!(s, "             fentry/fexit: {}", extra(&fentry));
            let _ = writeln!(
                s,
                "             shmtrace needs neither: stable tracepoints carry the whole capture"
            );
        }
        Err(e) => {
            problems += 1;
            let _ = writeln!(s, "hooks        CANNOT LOAD: {e:#}");
        }
    }

    // This namespace's /dev/shm.
    let shm = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .map(|t| crate::host::mountinfo::parse_mountinfo(&t))
        .and_then(|ms| ms.into_iter().rfind(|m| m.mountpoint == "/dev/shm"));
    match (shm, statfs_path("/dev/shm")) {
        (Some(m), Some(u)) if m.is_tmpfs() => {
            let _ = writeln!(
                s,
                "/dev/shm     tmpfs {} ({}), {} used ({:.0}%), {} free",
                human_bytes(u.size_bytes),
                m.dev,
                human_bytes(u.used_bytes),
                u.used_bytes as f64 * 100.0 / u.size_bytes.max(1) as f64,
                human_bytes(u.free_bytes())
            );
            let advice = if u.size_bytes <= 64 << 20 {
                format!(
                    "{} is Docker's and Kubernetes' default: a PyTorch DataLoader needs about \
                     (num_workers x prefetch_factor + 2) x batch bytes. Raise it (docker run --shm-size, \
                     or an emptyDir with medium: Memory mounted on /dev/shm), or find the size with \
                     `shmtrace run --verify -- CMD`.",
                    human_bytes(u.size_bytes)
                )
            } else {
                "size looks deliberate; `shmtrace run --verify -- CMD` checks it against a real run"
                    .into()
            };
            let _ = writeln!(s, "advice       {advice}");
        }
        (Some(m), _) => {
            let _ = writeln!(
                s,
                "/dev/shm     {} (not tmpfs): shared memory goes elsewhere here",
                m.fstype
            );
        }
        _ => {
            let _ = writeln!(
                s,
                "/dev/shm     not mounted in this namespace: POSIX shared memory will fail"
            );
        }
    }
    print!("{s}");
    Ok(if problems > 0 { 1 } else { 0 })
}
