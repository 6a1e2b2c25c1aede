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
            // One column for every hook, however long its name.
            let w = t.hooks.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
            for (name, err) in &t.hooks {
                match err {
                    None => {
                        let _ = writeln!(s, "  {name:<w$}  ok");
                    }
                    Some(e) => {
                        let _ = writeln!(
                            s,
                            "  {name:<w$}  REFUSED: {}",
                            e.lines().next().unwrap_or("")
                        );
                    }
                }
            }
            let _ = writeln!(
                s,
                "needs        (--hooks {}: which backend carries each)",
                format!("{:?}", crate::capture::hooks::backend()).to_lowercase()
            );
            let w = t.needs.iter().map(|n| n.need.len()).max().unwrap_or(0);
            for n in &t.needs {
                let _ = writeln!(s, "  {:<w$}  {} ({})", n.need, n.backend, n.hook);
                if let Some(why) = &n.fell_back {
                    let label = if n.backend == "none" {
                        "not seen"
                    } else {
                        "fell back"
                    };
                    let _ = writeln!(s, "  {:<w$}    {label}: {why}", "");
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
                "             shmtrace needs neither: without fexit, syscall tracepoints carry each need"
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
            let me = crate::host::memcg::read(std::path::Path::new("/"), std::process::id());
            let who = me
                .as_ref()
                .map(|m| crate::host::cgroup::parse(&m.path))
                .unwrap_or_default();
            let advice = shm_advice(&ShmFacts {
                size_bytes: u.size_bytes,
                mem_total_bytes: mem_total(),
                in_pod: who.pod_uid.is_some(),
                memcg_limit_bytes: me.and_then(|m| m.limit_bytes),
            });
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

/// What the advice on this namespace's /dev/shm rests on.
struct ShmFacts {
    size_bytes: u64,
    mem_total_bytes: Option<u64>,
    /// The cgroup path names a Kubernetes pod.
    in_pod: bool,
    /// This process's memory cgroup limit, if it has one.
    memcg_limit_bytes: Option<u64>,
}

/// Docker's `--shm-size` default (65536k) and Podman's (64000k): only these
/// exact sizes are "the default"; anything else was chosen by someone.
const DOCKER_DEFAULT: u64 = 65536 << 10;
const PODMAN_DEFAULT: u64 = 64000 << 10;

const DATALOADER_NEED: &str = "a PyTorch DataLoader needs about \
     (num_workers x prefetch_factor + 2) x batch bytes";

fn shm_advice(f: &ShmFacts) -> String {
    let size = human_bytes(f.size_bytes);
    let raise = if f.in_pod {
        "mount an emptyDir with medium: Memory and a sizeLimit on /dev/shm"
    } else {
        "docker run --shm-size / podman run --shm-size"
    };
    let find = "or find the size with `shmtrace run --verify -- CMD`";
    let default = match f.size_bytes {
        DOCKER_DEFAULT if f.in_pod => Some(format!(
            "{size} is the container runtime's default, which a Kubernetes pod gets \
             unless it mounts an emptyDir on /dev/shm"
        )),
        DOCKER_DEFAULT => Some(format!("{size} is Docker's default (--shm-size 65536k)")),
        PODMAN_DEFAULT => Some(format!("{size} is Podman's default (--shm-size 64000k)")),
        _ => None,
    };
    if let Some(d) = default {
        return format!("{d}: {DATALOADER_NEED}. Raise it ({raise}), {find}.");
    }
    // tmpfs without size= takes half of RAM; a mount that large never says
    // ENOSPC before memory runs out, so the memory cgroup (or the OOM
    // killer) is what stops a job.
    if let Some(mem) = f.mem_total_bytes
        && f.size_bytes >= mem / 2 - mem / 16
    {
        let limit = match f.memcg_limit_bytes {
            Some(l) => format!(
                "this memory cgroup's limit ({}): a job that fills /dev/shm past it is OOM-killed, not refused with ENOSPC",
                human_bytes(l)
            ),
            None => "the whole machine's memory: this cgroup has no memory limit, so filling /dev/shm starves the node".into(),
        };
        return format!(
            "unbounded: {size} is sized from this machine's RAM ({}), so the real limit is {limit}. \
             Cap /dev/shm below the memory the job may use ({raise}), {find}.",
            human_bytes(mem)
        );
    }
    let over_limit = f.memcg_limit_bytes.filter(|&l| l < f.size_bytes).map(|l| {
        format!(
            " It is larger than this memory cgroup's limit ({}): filling it ends in an OOM kill, \
             not ENOSPC.",
            human_bytes(l)
        )
    });
    let over_limit = over_limit.unwrap_or_default();
    if f.size_bytes < 256 << 20 {
        return format!(
            "{size} is small for multi-worker data loading: {DATALOADER_NEED}. Raise it ({raise}), {find}.{over_limit}"
        );
    }
    format!(
        "{size} was set on purpose; `shmtrace run --verify -- CMD` checks it against a real run.{over_limit}"
    )
}

/// MemTotal from /proc/meminfo.
fn mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb << 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(size: u64) -> ShmFacts {
        ShmFacts {
            size_bytes: size,
            mem_total_bytes: Some(16 << 30),
            in_pod: false,
            memcg_limit_bytes: None,
        }
    }

    #[test]
    fn only_the_runtimes_own_sizes_are_called_their_default() {
        let docker = shm_advice(&facts(65536 << 10));
        assert!(docker.contains("Docker's default"), "{docker}");
        assert!(!docker.contains("Kubernetes"), "{docker}");
        let podman = shm_advice(&facts(64000 << 10));
        assert!(podman.contains("Podman's default"), "{podman}");
        let pod = shm_advice(&ShmFacts {
            in_pod: true,
            ..facts(65536 << 10)
        });
        assert!(pod.contains("Kubernetes pod"), "{pod}");
        assert!(pod.contains("emptyDir"), "{pod}");
        for size in [16 << 20, 63 << 20, 100 << 20] {
            let a = shm_advice(&facts(size));
            assert!(!a.contains("default"), "{a}");
            assert!(a.contains("is small"), "{a}");
        }
    }

    #[test]
    fn a_mount_the_size_of_ram_is_unbounded() {
        // tmpfs' own default: half of RAM.
        let half = shm_advice(&facts(8 << 30));
        assert!(half.starts_with("unbounded: 8.0 GiB"), "{half}");
        assert!(half.contains("whole machine's memory"), "{half}");
        let limited = shm_advice(&ShmFacts {
            memcg_limit_bytes: Some(2 << 30),
            ..facts(16 << 30)
        });
        assert!(limited.contains("limit (2.0 GiB)"), "{limited}");
        assert!(limited.contains("OOM-killed"), "{limited}");
        assert!(!limited.contains("on purpose"), "{limited}");
    }

    #[test]
    fn a_chosen_size_is_checked_against_the_memory_limit() {
        let a = shm_advice(&facts(1 << 30));
        assert!(a.contains("on purpose"), "{a}");
        assert!(!a.contains("OOM"), "{a}");
        let b = shm_advice(&ShmFacts {
            memcg_limit_bytes: Some(512 << 20),
            ..facts(1 << 30)
        });
        assert!(
            b.contains("larger than this memory cgroup's limit (512.0 MiB)"),
            "{b}"
        );
    }
}
