//! A failure's cause and fix in words, from the typed facts state recorded
//! (`state::causes::Cause`): what the report's `cause` and `fix` say, and
//! the summary and live view show.

use crate::state::headroom::Headroom;
use crate::{
    event::CudaCall,
    host::memcg::Memcg,
    signals,
    state::{causes::Cause, failures::Failure, removals::Removal},
    units::{human_bytes, human_duration_ns},
};

/// Fills `f.cause` and `f.fix` from `f.why`.
pub fn word(f: &mut Failure) {
    f.cause = cause(f);
    f.fix = fix(f);
}

/// A copy of `f` with its cause and fix in words.
pub fn worded(f: &Failure) -> Failure {
    let mut f = f.clone();
    word(&mut f);
    f
}

/// What the evidence says happened.
pub fn cause(f: &Failure) -> String {
    let text = signals::errno_text;
    match &f.why {
        Cause::PageFull => "the tmpfs had no free page for this write (full)".into(),
        Cause::PageFreedSince => "the page could not be allocated on tmpfs (it had room by the time it was measured: another process freed space)".into(),
        Cause::PageUnknown => "the page could not be allocated on tmpfs".into(),
        Cause::SigbusCode(code) => {
            format!("{} on a tmpfs mapping", signals::sigbus_code_name(*code))
        }
        Cause::CreateAtInodeLimit { total: Some(total) } => {
            format!("creating a file failed: the tmpfs inode limit ({total}) is reached")
        }
        Cause::CreateAtInodeLimit { total: None } => {
            "creating a file failed: the tmpfs inode limit is reached".into()
        }
        Cause::CreateFailed { errno } => {
            format!("creating a file on tmpfs failed: {}", text(*errno))
        }
        Cause::Full {
            syscall,
            asked: Some(b),
            free: Some(free),
            ..
        } => {
            let sc = syscall.name();
            // Request and free space that print alike: exact bytes.
            if human_bytes(*b) == human_bytes(*free) {
                format!(
                    "{sc} asked for {b} bytes but the tmpfs had {free} bytes free (No space left on device)"
                )
            } else {
                format!(
                    "{sc} asked for {} but the tmpfs had {} free (No space left on device)",
                    human_bytes(*b),
                    human_bytes(*free)
                )
            }
        }
        Cause::Full { syscall, errno, .. } => {
            format!("{} found the tmpfs full ({})", syscall.name(), text(*errno))
        }
        Cause::Quota { syscall, errno } => {
            format!("{} exceeded a tmpfs quota ({})", syscall.name(), text(*errno))
        }
        Cause::FileSizeLimit { syscall, max } => format!(
            "{} would make the file larger than the process's RLIMIT_FSIZE (ulimit -f) of {}",
            syscall.name(),
            human_bytes(*max)
        ),
        Cause::FileTooLarge { syscall, errno } => format!(
            "{} asked for a file larger than tmpfs allows ({})",
            syscall.name(),
            text(*errno)
        ),
        Cause::AddressSpace {
            syscall,
            want,
            max,
            vm,
        } => format!(
            "{} of {} would take the process past its RLIMIT_AS (ulimit -v) of {} ({} mapped already); /dev/shm had nothing to do with it",
            syscall.name(),
            human_bytes(*want),
            human_bytes(*max),
            human_bytes(*vm)
        ),
        Cause::MapCount {
            syscall,
            count,
            max,
        } => format!(
            "{} failed: the process has {count} mappings, at vm.max_map_count ({max})",
            syscall.name()
        ),
        Cause::NoRoomForMapping {
            syscall,
            want,
            errno,
        } => format!(
            "{} of {} failed: the kernel found no room for the mapping ({})",
            syscall.name(),
            human_bytes(*want),
            text(*errno)
        ),
        Cause::MemcgLimit { syscall, max } => format!(
            "{} on tmpfs failed: its memory cgroup is at its limit of {} (tmpfs pages are charged to the cgroup of the process that touches them)",
            syscall.name(),
            human_bytes(*max)
        ),
        Cause::NoMemory { syscall, errno } => format!(
            "{} on tmpfs failed: {} (the system or its memory cgroup had no memory for the pages)",
            syscall.name(),
            text(*errno)
        ),
        Cause::Noexec { syscall, errno } => format!(
            "{} with PROT_EXEC failed: the tmpfs is mounted noexec ({})",
            syscall.name(),
            text(*errno)
        ),
        Cause::Sealed { syscall, errno } => format!(
            "{} failed: a seal on the file forbids it (F_SEAL_WRITE/F_SEAL_FUTURE_WRITE) ({})",
            syscall.name(),
            text(*errno)
        ),
        Cause::PermissionDenied { syscall, errno } => format!(
            "{} failed: the fd does not allow what was asked ({}; e.g. O_RDONLY with PROT_WRITE|MAP_SHARED)",
            syscall.name(),
            text(*errno)
        ),
        Cause::FdLimit { syscall, max } => format!(
            "{} failed: the process has no fd left (RLIMIT_NOFILE{})",
            syscall.name(),
            max.map(|n| format!(" {n}")).unwrap_or_default()
        ),
        Cause::SystemFdLimit { syscall } => format!(
            "{} failed: the system's open file table is full (fs.file-max)",
            syscall.name()
        ),
        Cause::InvalidArgument { syscall, errno } => format!(
            "{} failed: {} (a misaligned offset, a zero length, or flags the file does not support)",
            syscall.name(),
            text(*errno)
        ),
        Cause::OtherErrno { syscall, errno } => {
            format!("{} on tmpfs failed: {}", syscall.name(), text(*errno))
        }
        Cause::OomKill { shmem_rss } => {
            let held = if *shmem_rss > 0 {
                format!(" holding {} of shared memory", human_bytes(*shmem_rss))
            } else {
                String::new()
            };
            let limit = f
                .memcg
                .as_ref()
                .map(|m| oom_words(f, m, *shmem_rss).0)
                .unwrap_or_default();
            format!(
                "the OOM killer chose this process{held}{limit} (shared memory pages count against its memory cgroup)"
            )
        }
        Cause::CudaIpc { call, code } => format!(
            "{}() returned {code} ({})",
            call.name(),
            call.error_name(*code)
        ),
        Cause::SegmentGone => match &f.removed_by {
            Some(r) => {
                let ago = human_duration_ns(f.ts_ns.saturating_sub(r.ts_ns));
                let whose = if r.pid == f.pid {
                    "by this same process".to_string()
                } else {
                    format!(
                        "by pid {} ({}){}",
                        r.pid,
                        r.comm,
                        r.container
                            .as_deref()
                            .map(|c| format!(" in container {c}"))
                            .unwrap_or_default()
                    )
                };
                format!(
                    "the segment was gone: {} was removed {ago} before, {whose}",
                    r.path
                )
            }
            None => "no file by that name: shmtrace saw no process remove it (it was \
                     never created under this name, or removed before tracing began)"
                .into(),
        },
        Cause::Unknown => String::new(),
    }
}

/// What to change, for causes a bigger /dev/shm does not fix (and the
/// inode limit).
pub fn fix(f: &Failure) -> Option<String> {
    let s: &str = match &f.why {
        Cause::CreateAtInodeLimit { .. } => {
            "mount the tmpfs with a larger nr_inodes= (or remove leftover files)"
        }
        Cause::Quota { .. } => {
            "raise the user's or group's tmpfs quota (usrquota_block_hardlimit=, grpquota_block_hardlimit=)"
        }
        Cause::FileSizeLimit { .. } => {
            "raise the file size limit: ulimit -f unlimited, docker/podman --ulimit fsize=-1, or LimitFSIZE= in a systemd unit"
        }
        Cause::AddressSpace { .. } => {
            "raise the address-space limit: ulimit -v unlimited, docker/podman --ulimit as=-1 (GPU and PyTorch processes map far more than they use)"
        }
        Cause::MapCount { max, .. } => {
            return Some(format!(
                "raise it: sysctl -w vm.max_map_count={}",
                (max * 4).max(262144)
            ));
        }
        Cause::NoRoomForMapping { .. } => {
            "not a /dev/shm size: look at the process's memory and address-space limits"
        }
        Cause::MemcgLimit { .. } => {
            "raise the container's memory limit by what /dev/shm holds (Kubernetes: resources.limits.memory; an emptyDir medium: Memory counts against it)"
        }
        Cause::Noexec { .. } => {
            "map without PROT_EXEC, or mount the tmpfs without noexec (Docker mounts /dev/shm noexec by default)"
        }
        Cause::Sealed { .. } => "map it read-only or MAP_PRIVATE, or do not seal it before mapping",
        Cause::PermissionDenied { .. } => {
            "open the file with the access the mapping needs (O_RDWR for a shared writable mapping)"
        }
        Cause::FdLimit { .. } => {
            "raise ulimit -n (docker/podman --ulimit nofile=1048576), or in PyTorch torch.multiprocessing.set_sharing_strategy('file_system'): the default 'file_descriptor' strategy keeps one fd per shared tensor"
        }
        Cause::SystemFdLimit { .. } => "raise sysctl fs.file-max",
        Cause::OomKill { shmem_rss } => {
            return Some(match &f.memcg {
                Some(m) => oom_words(f, m, *shmem_rss).1,
                None => "raise the memory limit of its cgroup by what it keeps in /dev/shm: tmpfs pages count against it".into(),
            });
        }
        Cause::CudaIpc { call, code } => return Some(cuda_fix(*call, &call.error_name(*code))),
        Cause::SegmentGone => {
            return Some(match &f.removed_by {
                Some(r) => gone_fix(r),
                None => "check the name the consumer opens against the one the producer created, \
                         and that the producer had created it before the consumer looked"
                    .into(),
            });
        }
        _ => return None,
    };
    Some(s.to_string())
}

/// The memory cgroup whose limit applies, in words, for the process(es)
/// `owner` names ("its", "its writers'"): their own, or an ancestor above
/// it (the pod's, in Kubernetes).
pub fn limit_holder(m: &Memcg, owner: &str) -> String {
    if !m.limited_above() {
        return format!("{owner} memory cgroup {}", m.path);
    }
    let above = m.limiting();
    let whose = match crate::state::headroom::pod_cgroup(&m.path) {
        Some(pod) if crate::escape::str(&pod) == above => "the pod's memory cgroup",
        _ => "the memory cgroup",
    };
    format!(
        "{whose} {above} (above {owner} own cgroup {}, which has no tighter limit)",
        m.path
    )
}

/// The files that filled a memory cgroup at an OOM kill, in words:
/// "/dev/shm/big 46.7 MiB (named: it keeps the charge ...), ...".
pub fn charged_words(f: &Failure) -> Option<String> {
    let list: Vec<String> = f
        .charged_files
        .iter()
        .map(|c| {
            let what = c.path.clone().unwrap_or_else(|| format!("inode {}", c.ino));
            let keeps = if c.outlives_victim {
                if c.unlinked {
                    "removed, but another process holds it: it keeps its charge"
                } else {
                    "named: it keeps its charge after the kill"
                }
            } else {
                "removed: freed with the victim"
            };
            format!("{what} {} ({keeps})", human_bytes(c.bytes))
        })
        .collect();
    (!list.is_empty()).then(|| list.join(", "))
}

/// An OOM kill in words: (", in memory cgroup X: limit L, U in use, S of
/// it shmem, filled by these files", the fix).
fn oom_words(f: &Failure, m: &Memcg, shmem_rss: u64) -> (String, String) {
    let shmem = m.shmem_bytes.unwrap_or(shmem_rss);
    let filled = charged_words(f)
        .map(|w| format!("; the /dev/shm files charged to it: {w}"))
        .unwrap_or_default();
    let Some(limit) = m.limit_bytes else {
        return (
            format!(
                "; its memory cgroup {} has no limit on its whole path to the root ({} in use, {} of it shmem): the node's memory ran out{filled}",
                m.path,
                human_bytes(m.usage_bytes),
                human_bytes(shmem)
            ),
            "the node ran out of memory: count /dev/shm against the pods' memory requests and limits, or cap /dev/shm (an emptyDir sizeLimit, --shm-size)".into(),
        );
    };
    // Which limit fired: the kernel's own line says it, else memory.events.
    let fired = match (&f.kernel_oom, m.oom_kills) {
        (Some(k), _) => match &k.oom_memcg {
            Some(c) if c == m.limiting() => {
                format!(" (the kernel's OOM line names {c}: this limit fired)")
            }
            Some(c) => format!(" (but the kernel's OOM line names {c} as the cgroup at its limit)"),
            None => format!(
                " (but the kernel's OOM line says {}: the node's memory ran out, not this limit)",
                k.constraint
            ),
        },
        (None, Some(n)) if n > 0 => format!(
            " (its memory.events counts {n} OOM kill{} there: this limit fired)",
            if n == 1 { "" } else { "s" }
        ),
        _ => String::new(),
    };
    let other = m.usage_bytes.saturating_sub(shmem);
    let whose = if !m.limited_above() {
        format!("the memory limit ({})", human_bytes(limit))
    } else if crate::state::headroom::pod_cgroup(&m.path)
        .is_some_and(|p| crate::escape::str(&p) == m.limiting())
    {
        format!(
            "the pod's memory limit ({} on {})",
            human_bytes(limit),
            m.limiting()
        )
    } else {
        format!(
            "the parent cgroup's memory limit ({} on {})",
            human_bytes(limit),
            m.limiting()
        )
    };
    let stays = f
        .charged_files
        .iter()
        .filter(|c| c.outlives_victim && !c.unlinked)
        .filter_map(|c| c.path.clone())
        .collect::<Vec<_>>();
    let crash_loop = if stays.is_empty() {
        String::new()
    } else {
        format!(
            "; {} stay{} charged after the kill, so the next process there is killed again: remove {} (or have the job unlink its files once they are open)",
            stays.join(", "),
            if stays.len() == 1 { "s" } else { "" },
            if stays.len() == 1 { "it" } else { "them" }
        )
    };
    (
        format!(
            "; {} allows {}{fired}, and had {} in use, {} of it shmem (/dev/shm, memfd){filled}",
            limit_holder(m, "its"),
            human_bytes(limit),
            human_bytes(m.usage_bytes),
            human_bytes(shmem)
        ),
        format!(
            "raise {whose} above {} (what the job keeps in shared memory, {} at the kill and still growing, plus its other {}), or cap /dev/shm below {} (the limit less the rest) so that it fills with a clear ENOSPC before the cgroup does; a Kubernetes Memory emptyDir counts against the pod's limit (since 1.32 it is sized min(sizeLimit, pod limit)){crash_loop}",
            human_bytes(shmem + other),
            human_bytes(shmem),
            human_bytes(other),
            human_bytes(limit.saturating_sub(other))
        ),
    )
}

/// What to do about a CUDA IPC error: never a bigger /dev/shm.
fn cuda_fix(call: CudaCall, error: &str) -> String {
    let what = match error {
        "cudaErrorMemoryAllocation" | "CUDA_ERROR_OUT_OF_MEMORY" => {
            "the GPU is out of memory for the shared allocation: free GPU memory (smaller batches, torch.cuda.empty_cache() in the producer, fewer tensors kept alive on the GPU), or share CPU tensors instead"
        }
        "cudaErrorInsufficientDriver" | "cudaErrorNoDevice" | "CUDA_ERROR_NO_DEVICE" => {
            "the process sees no usable GPU or driver (the container lacks the GPU, or the driver is older than the CUDA runtime): fix the GPU setup of the container"
        }
        "cudaErrorNotSupported" | "CUDA_ERROR_NOT_SUPPORTED" => {
            "CUDA IPC is not supported here (some virtualized or MIG GPUs, WSL): share CPU tensors, or use torch.multiprocessing's file_system strategy on CPU"
        }
        _ => {
            "a CUDA IPC error: check GPU memory, the driver, and that both processes see the same GPU (CUDA_VISIBLE_DEVICES, the same container)"
        }
    };
    format!(
        "{what}; {} is GPU-side: a bigger /dev/shm does not help",
        call.name()
    )
}

/// What keeps a segment alive until its consumer opens it, by remover.
fn gone_fix(r: &Removal) -> String {
    match r.comm.as_str() {
        "systemd-logind" | "systemd" => "systemd-logind removes a user's /dev/shm files when \
            the user's last session ends (RemoveIPC=yes): set RemoveIPC=no in \
            /etc/systemd/logind.conf, or run the job as a system user"
            .to_string(),
        "rm" | "find" | "sh" | "bash" | "dash" | "tmpreaper" | "tmpwatch" | "systemd-tmpfile" => {
            format!(
                "a cleanup removed it while it was in use: keep {} away from /dev/shm while \
                 jobs run (remove only files whose creators exited: `shmtrace` lists them \
                 as leftovers)",
                r.comm
            )
        }
        _ => "the segment was removed before its consumer opened it: keep it until every \
              consumer has opened it (for PyTorch's file_system sharing strategy, keep the \
              producer's tensor alive until the consumer has received it)"
            .to_string(),
    }
}

/// A Memory emptyDir's size against its pod's memory limit: which of
/// Kubernetes' rules made it (since 1.32 min(sizeLimit, pod limit)).
fn emptydir_rule(size: u64, pod_limit: u64) -> String {
    let page = crate::units::page_size();
    if size.abs_diff(pod_limit) < page {
        format!(
            "Kubernetes sized this Memory emptyDir at the pod's memory limit ({}): no sizeLimit was set, or a larger one (since 1.32 the size is min(sizeLimit, pod limit)); set a sizeLimit below the room, or raise the container's limit",
            human_bytes(pod_limit)
        )
    } else if size < pod_limit {
        format!(
            "its size is the emptyDir's sizeLimit (the pod's memory limit is {}): lower sizeLimit below the room, or raise the container's limit",
            human_bytes(pod_limit)
        )
    } else {
        format!(
            "it is larger than the pod's memory limit ({}): a kubelet before 1.32 sized it by sizeLimit alone (or the node's memory without one); lower sizeLimit below the room",
            human_bytes(pod_limit)
        )
    }
}

/// A mount its writers' memory cgroup cannot fill, in words.
pub fn headroom(mountpoint: Option<&str>, h: &Headroom) -> String {
    let (size, m, room, pod_limit) = (h.size, &h.memcg, h.room, h.pod_limit);
    let rule = match pod_limit {
        Some(p) => format!("; {}", emptydir_rule(size, p)),
        None => " (Kubernetes sizes a Memory emptyDir at min(sizeLimit, the pod's memory limit) since 1.32; before that, sizeLimit alone)".to_string(),
    };
    format!(
        "{} is {} but {} allows {} ({} in use, {} of it shmem) and leaves about {} for shared memory: it can never fill; the OOM killer strikes first. Raise the memory limit, or size /dev/shm below {}{rule}",
        mountpoint.unwrap_or("the mount"),
        human_bytes(size),
        limit_holder(m, "its writers'"),
        human_bytes(m.limit_bytes.unwrap_or(0)),
        human_bytes(m.usage_bytes),
        human_bytes(m.shmem_bytes.unwrap_or(0)),
        human_bytes(room),
        human_bytes(room)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{event::Syscall, state::failures::FailureKind, units::MIB};

    fn failing(why: Cause) -> Failure {
        let mut f = Failure::new(FailureKind::Enospc, 5_000_000, 20, 20);
        f.why = why;
        f
    }

    #[test]
    fn asked_and_free_that_print_alike_are_given_in_bytes() {
        let full = |asked, free| {
            cause(&failing(Cause::Full {
                syscall: Syscall::Fallocate,
                errno: libc::ENOSPC,
                asked: Some(asked),
                free: Some(free),
            }))
        };
        assert_eq!(
            full(32 * MIB, 32 * MIB),
            "fallocate asked for 33554432 bytes but the tmpfs had 33554432 bytes free (No space left on device)"
        );
        assert_eq!(
            full(32 * MIB, 4 * MIB),
            "fallocate asked for 32.0 MiB but the tmpfs had 4.0 MiB free (No space left on device)"
        );
        // No numbers: the errno says it.
        let f = failing(Cause::Full {
            syscall: Syscall::Write,
            errno: libc::ENOSPC,
            asked: None,
            free: None,
        });
        assert_eq!(
            cause(&f),
            "write found the tmpfs full (No space left on device)"
        );
        assert_eq!(fix(&f), None, "a bigger /dev/shm is the fix: no other");
    }

    #[test]
    fn limits_name_themselves_with_their_values_and_fixes() {
        let f = failing(Cause::AddressSpace {
            syscall: Syscall::Mmap,
            want: 16 * MIB,
            max: 256 * MIB,
            vm: 250 * MIB,
        });
        assert!(
            cause(&f).contains("RLIMIT_AS (ulimit -v) of 256.0 MiB (250.0 MiB mapped already)")
        );
        assert!(fix(&f).unwrap().contains("ulimit -v unlimited"));
        let f = failing(Cause::MapCount {
            syscall: Syscall::Mmap,
            count: 65530,
            max: 65530,
        });
        assert_eq!(
            fix(&f).unwrap(),
            "raise it: sysctl -w vm.max_map_count=262144"
        );
        let f = failing(Cause::FdLimit {
            syscall: Syscall::Openat,
            max: Some(1024),
        });
        assert!(cause(&f).ends_with("(RLIMIT_NOFILE 1024)"), "{}", cause(&f));
        assert!(fix(&f).unwrap().contains("file_system"));
        let f = failing(Cause::CreateAtInodeLimit { total: Some(1000) });
        assert!(cause(&f).contains("inode limit (1000)"));
        assert!(fix(&f).unwrap().contains("nr_inodes="));
        let f = failing(Cause::Noexec {
            syscall: Syscall::Mmap,
            errno: libc::EPERM,
        });
        assert!(fix(&f).unwrap().contains("noexec"));
    }

    #[test]
    fn an_oom_kill_gives_the_limit_and_a_cap_below_it() {
        let mut f = failing(Cause::OomKill {
            shmem_rss: 40 * MIB,
        });
        assert!(
            fix(&f)
                .unwrap()
                .starts_with("raise the memory limit of its cgroup")
        );
        f.memcg = Some(Memcg {
            path: "/kubepods/pod1/c".into(),
            version: 2,
            limit_bytes: Some(48 * MIB),
            usage_bytes: 48 * MIB,
            shmem_bytes: Some(46 * MIB),
            own_limit_bytes: Some(48 * MIB),
            limit_path: Some("/kubepods/pod1/c".into()),
            limit_raw: Some("/kubepods/pod1/c".into()),
            ..Default::default()
        });
        let c = cause(&f);
        assert!(c.contains("holding 40.0 MiB of shared memory"), "{c}");
        assert!(c.contains("allows 48.0 MiB"), "{c}");
        // The rest of the cgroup's use is 2 MiB: /dev/shm must stay below 46.
        assert!(fix(&f).unwrap().contains("cap /dev/shm below 46.0 MiB"));
        f.memcg.as_mut().unwrap().limit_bytes = None;
        assert!(cause(&f).contains("has no limit on its whole path to the root"));
    }

    /// Kubernetes on cgroup v2: the container's scope is unlimited, the pod
    /// slice holds 48 MiB, and a named /dev/shm file filled it.
    #[test]
    fn an_oom_kill_at_a_pod_limit_names_the_pod_and_the_file() {
        let pod = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b.slice";
        let scope = format!("{pod}/cri-containerd-abc.scope");
        let mut f = failing(Cause::OomKill {
            shmem_rss: 46 * MIB,
        });
        f.memcg = Some(Memcg {
            path: scope.clone(),
            version: 2,
            limit_bytes: Some(48 * MIB),
            limit_path: Some(pod.into()),
            limit_raw: Some(pod.into()),
            own_limit_bytes: None,
            usage_bytes: 48 * MIB,
            shmem_bytes: Some(46 * MIB + 700 * 1024),
            oom_kills: Some(1),
            ..Default::default()
        });
        f.charged_files = vec![crate::state::failures::ChargedFile {
            path: Some("/dev/shm/big".into()),
            dev: crate::event::Dev(40),
            ino: 5,
            mountpoint: Some("/dev/shm".into()),
            bytes: 46 * MIB + 700 * 1024,
            unlinked: false,
            outlives_victim: true,
        }];
        let c = cause(&f);
        assert!(
            c.contains(&format!(
                "the pod's memory cgroup {pod} (above its own cgroup {scope}, which has no tighter limit) allows 48.0 MiB (its memory.events counts 1 OOM kill there: this limit fired)"
            )),
            "{c}"
        );
        assert!(
            c.contains("the /dev/shm files charged to it: /dev/shm/big 46.7 MiB (named: it keeps its charge after the kill)"),
            "{c}"
        );
        // The kernel's own line, when it could be read, says which fired.
        let mut k = f.clone();
        k.kernel_oom = Some(crate::host::kmsg::OomLine {
            constraint: "CONSTRAINT_MEMCG".into(),
            oom_memcg: Some(pod.into()),
            task_memcg: Some(scope.clone()),
            task: "dd".into(),
            pid: 20,
        });
        assert!(
            cause(&k).contains(&format!(
                "(the kernel's OOM line names {pod}: this limit fired)"
            )),
            "{}",
            cause(&k)
        );
        k.kernel_oom.as_mut().unwrap().oom_memcg = None;
        k.kernel_oom.as_mut().unwrap().constraint = "CONSTRAINT_NONE".into();
        assert!(cause(&k).contains("says CONSTRAINT_NONE: the node's memory ran out"));
        let fix = fix(&f).unwrap();
        assert!(
            fix.starts_with(&format!(
                "raise the pod's memory limit (48.0 MiB on {pod}) above 48.0 MiB"
            )),
            "{fix}"
        );
        assert!(fix.contains("cap /dev/shm below 46.7 MiB"), "{fix}");
        {
            // A limit on a parent that is no pod: the parent's.
            let mut g = f.clone();
            g.memcg.as_mut().unwrap().path = "/job/worker".into();
            g.memcg.as_mut().unwrap().limit_path = Some("/job".into());
            let fix = super::fix(&g).unwrap();
            assert!(
                fix.starts_with("raise the parent cgroup's memory limit (48.0 MiB on /job)"),
                "{fix}"
            );
        }
        assert!(
            fix.ends_with("/dev/shm/big stays charged after the kill, so the next process there is killed again: remove it (or have the job unlink its files once they are open)"),
            "{fix}"
        );
    }

    #[test]
    fn cuda_errors_are_never_fixed_by_dev_shm() {
        for (code, words) in [
            (2, "out of memory"),
            (35, "no usable GPU"),
            (801, "not supported"),
            (999, "a CUDA IPC error"),
        ] {
            let f = failing(Cause::CudaIpc {
                call: CudaCall::GetMemHandle,
                code,
            });
            let fix = fix(&f).unwrap();
            assert!(fix.contains(words), "{code}: {fix}");
            assert!(fix.ends_with("a bigger /dev/shm does not help"));
        }
    }

    #[test]
    fn a_segment_gone_names_its_remover_and_the_fix_by_remover() {
        let mut f = failing(Cause::SegmentGone);
        assert!(cause(&f).contains("saw no process remove it"));
        assert!(fix(&f).unwrap().contains("check the name"));
        f.removed_by = Some(Removal {
            pid: 77,
            ppid: 1,
            comm: "rm".into(),
            ts_ns: 3_900_000,
            path: "/dev/shm/psm_1".into(),
            container: Some("podman:abc".into()),
        });
        assert_eq!(
            cause(&f),
            "the segment was gone: /dev/shm/psm_1 was removed 1.1 ms before, by pid 77 (rm) in container podman:abc"
        );
        assert!(fix(&f).unwrap().contains("keep rm away from /dev/shm"));
        f.removed_by.as_mut().unwrap().comm = "systemd-logind".into();
        assert!(fix(&f).unwrap().contains("RemoveIPC=no"));
        f.removed_by.as_mut().unwrap().pid = 20;
        assert!(cause(&f).ends_with("by this same process"));
    }

    #[test]
    fn sigbus_causes_say_whether_the_mount_was_full() {
        assert!(cause(&failing(Cause::PageFull)).contains("(full)"));
        assert!(cause(&failing(Cause::PageFreedSince)).contains("another process freed space"));
        assert_eq!(
            cause(&failing(Cause::SigbusCode(4))),
            "BUS_MCEERR_AR on a tmpfs mapping"
        );
    }

    #[test]
    fn which_emptydir_rule_made_the_size() {
        assert!(emptydir_rule(64 * MIB, 64 * MIB).contains("at the pod's memory limit"));
        assert!(emptydir_rule(32 * MIB, 64 * MIB).contains("is the emptyDir's sizeLimit"));
        assert!(emptydir_rule(128 * MIB, 64 * MIB).contains("before 1.32"));
    }

    #[test]
    fn a_mount_its_cgroup_cannot_fill_says_by_how_much() {
        let h = Headroom {
            size: 64 * MIB,
            room: 20 * MIB,
            memcg: Memcg {
                path: "/kubepods/pod1/c".into(),
                version: 2,
                limit_bytes: Some(24 * MIB),
                usage_bytes: 5 * MIB,
                shmem_bytes: Some(MIB),
                own_limit_bytes: Some(24 * MIB),
                limit_path: Some("/kubepods/pod1/c".into()),
                limit_raw: Some("/kubepods/pod1/c".into()),
                ..Default::default()
            },
            pod_limit: None,
        };
        let w = headroom(Some("/dev/shm"), &h);
        assert!(w.starts_with("/dev/shm is 64.0 MiB but its writers' memory cgroup /kubepods/pod1/c allows 24.0 MiB"), "{w}");
        let mut above = h.memcg.clone();
        above.path = "/kubepods/pod1/c".into();
        above.own_limit_bytes = None;
        above.limit_path = Some("/kubepods/pod1".into());
        let w = headroom(
            Some("/dev/shm"),
            &Headroom {
                memcg: above,
                ..h.clone()
            },
        );
        assert!(
            w.starts_with("/dev/shm is 64.0 MiB but the pod's memory cgroup /kubepods/pod1 (above its writers' own cgroup /kubepods/pod1/c, which has no tighter limit) allows 24.0 MiB"),
            "{w}"
        );
        assert!(w.contains("size /dev/shm below 20.0 MiB"), "{w}");
        assert!(w.ends_with("before that, sizeLimit alone)"), "{w}");
        let w = headroom(
            None,
            &Headroom {
                pod_limit: Some(64 * MIB),
                ..h
            },
        );
        assert!(w.starts_with("the mount is"), "{w}");
        assert!(w.contains("at the pod's memory limit (64.0 MiB)"), "{w}");
    }
}
