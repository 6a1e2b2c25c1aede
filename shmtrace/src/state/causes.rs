//! Why a call failed, from its errno and what surrounded it: a tmpfs out
//! of pages or inodes is one cause among many. An mmap refused by
//! RLIMIT_AS, a noexec mount or a seal, a write past RLIMIT_FSIZE, a memory
//! cgroup at its limit, a process out of fds: each has its own fix, and a
//! bigger /dev/shm is the fix only for the first two.

use serde::Serialize;

use crate::{event::Syscall, host::Limits, units::human_bytes};

/// The cause, as a stable name (JSON `reason`, see [`Reason::name`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reason {
    /// The tmpfs had no free page (its size= limit).
    TmpfsFull,
    /// The tmpfs had no free inode (its nr_inodes= limit).
    TmpfsInodes,
    /// A tmpfs quota (usrquota/grpquota).
    Quota,
    /// mmap beyond the process's RLIMIT_AS (ulimit -v).
    AddressSpaceLimit,
    /// mmap beyond vm.max_map_count mappings.
    MapCountLimit,
    /// The kernel found no memory or address space for the call.
    OutOfMemory,
    /// A memory cgroup at its limit: tmpfs pages are charged to it.
    MemcgLimit,
    /// The OOM killer chose the process.
    OomKill,
    /// PROT_EXEC on a noexec mount.
    Noexec,
    /// A memfd seal forbids the mapping or write.
    Sealed,
    /// The fd lacks the access the call asks for.
    PermissionDenied,
    /// A write or truncate past RLIMIT_FSIZE (ulimit -f).
    FileSizeLimit,
    /// The process hit RLIMIT_NOFILE (ulimit -n).
    FdLimit,
    /// The system hit fs.file-max.
    SystemFdLimit,
    InvalidArgument,
    /// A hardware memory error (machine check) on the page.
    HardwareError,
    /// A CUDA IPC call failed: GPU memory or IPC limits, not /dev/shm.
    CudaIpc,
    /// An open found a shared-memory segment gone (removed before it).
    SegmentGone,
    #[default]
    Other,
}

impl Serialize for Reason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl Reason {
    /// The stable name: in the report, metrics labels and signatures.
    pub fn name(self) -> &'static str {
        match self {
            Self::TmpfsFull => "tmpfs_full",
            Self::TmpfsInodes => "tmpfs_inodes",
            Self::Quota => "quota",
            Self::AddressSpaceLimit => "address_space_limit",
            Self::MapCountLimit => "map_count_limit",
            Self::OutOfMemory => "out_of_memory",
            Self::MemcgLimit => "memcg_limit",
            Self::OomKill => "oom_kill",
            Self::CudaIpc => "cuda_ipc",
            Self::SegmentGone => "segment_gone",
            Self::Noexec => "noexec",
            Self::Sealed => "sealed",
            Self::PermissionDenied => "permission_denied",
            Self::FileSizeLimit => "file_size_limit",
            Self::FdLimit => "fd_limit",
            Self::SystemFdLimit => "system_fd_limit",
            Self::InvalidArgument => "invalid_argument",
            Self::HardwareError => "hardware_error",
            Self::Other => "other",
        }
    }

    /// Whether a bigger (or differently sized) tmpfs is the fix.
    pub fn tmpfs_ran_out(self) -> bool {
        matches!(self, Self::TmpfsFull | Self::TmpfsInodes)
    }
}

/// A limit a failure ran into, with its value when known.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Limit {
    /// "RLIMIT_AS", "vm.max_map_count", "memory.max", ...
    pub name: &'static str,
    pub value: Option<u64>,
    /// How much of it was in use (address space, mappings, fds, memory).
    pub used: Option<u64>,
}

/// A cause in words, its name, the limit and the fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explained {
    pub reason: Reason,
    pub cause: String,
    pub limit: Option<Limit>,
    pub fix: Option<String>,
}

/// What surrounded a failed call on a tmpfs file.
pub struct Call<'a> {
    pub syscall: Syscall,
    pub errno: i32,
    /// mmap's protection bits.
    pub prot: Option<u64>,
    /// Bytes asked for, and where.
    pub bytes: Option<u64>,
    pub offset: Option<u64>,
    /// The file is a memfd (on the kernel's internal shm mount).
    pub memfd: bool,
    pub noexec: bool,
    /// Free bytes and inodes of its mount at the failure.
    pub free_bytes: Option<u64>,
    pub inodes_free: Option<u64>,
    pub limits: &'a Limits,
}

const PROT_EXEC: u64 = 0x4;
use crate::units::MIB;

pub fn explain(c: &Call) -> Explained {
    let sc = c.syscall.name();
    let is_map = matches!(c.syscall, Syscall::Mmap | Syscall::Mremap);
    let l = c.limits;
    let limit = |name, value, used| Some(Limit { name, value, used });
    let text = crate::signals::errno_text(c.errno);
    let e = |reason, cause: String, limit, fix: Option<String>| Explained {
        reason,
        cause,
        limit,
        fix,
    };
    match c.errno {
        libc::ENOSPC if c.syscall.is_open() => match c.inodes_free {
            Some(0) | Some(1) => e(
                Reason::TmpfsInodes,
                "creating a file failed: the tmpfs inode limit is reached".into(),
                None,
                Some("mount the tmpfs with a larger nr_inodes= (or remove leftover files)".into()),
            ),
            _ => e(
                Reason::TmpfsFull,
                format!("creating a file on tmpfs failed: {text}"),
                None,
                None,
            ),
        },
        libc::ENOSPC => e(Reason::TmpfsFull, format!("{sc} found the tmpfs full ({text})"), None, None),
        libc::EDQUOT => e(
            Reason::Quota,
            format!("{sc} exceeded a tmpfs quota ({text})"),
            None,
            Some("raise the user's or group's tmpfs quota (usrquota_block_hardlimit=, grpquota_block_hardlimit=)".into()),
        ),
        libc::EFBIG => {
            let end = c.offset.unwrap_or(0).saturating_add(c.bytes.unwrap_or(0));
            match l.file_size {
                Some(max) => e(
                    Reason::FileSizeLimit,
                    format!(
                        "{sc} would make the file larger than the process's RLIMIT_FSIZE (ulimit -f) of {}",
                        human_bytes(max)
                    ),
                    limit("RLIMIT_FSIZE", Some(max), Some(end)),
                    Some("raise the file size limit: ulimit -f unlimited, docker/podman --ulimit fsize=-1, or LimitFSIZE= in a systemd unit".into()),
                ),
                None => e(
                    Reason::FileSizeLimit,
                    format!("{sc} asked for a file larger than tmpfs allows ({text})"),
                    None,
                    None,
                ),
            }
        }
        libc::ENOMEM if is_map => {
            let want = c.bytes.unwrap_or(0);
            if let (Some(max), Some(vm)) = (l.address_space, l.vm_bytes)
                && vm.saturating_add(want) > max.saturating_sub(MIB)
            {
                e(
                    Reason::AddressSpaceLimit,
                    format!(
                        "{sc} of {} would take the process past its RLIMIT_AS (ulimit -v) of {} ({} mapped already); /dev/shm had nothing to do with it",
                        human_bytes(want),
                        human_bytes(max),
                        human_bytes(vm)
                    ),
                    limit("RLIMIT_AS", Some(max), Some(vm)),
                    Some("raise the address-space limit: ulimit -v unlimited, docker/podman --ulimit as=-1 (GPU and PyTorch processes map far more than they use)".into()),
                )
            } else if let (Some(max), Some(n)) = (l.max_map_count, l.map_count)
                && n + 2 >= max
            {
                e(
                    Reason::MapCountLimit,
                    format!("{sc} failed: the process has {n} mappings, at vm.max_map_count ({max})"),
                    limit("vm.max_map_count", Some(max), Some(n)),
                    Some(format!("raise it: sysctl -w vm.max_map_count={}", (max * 4).max(262144))),
                )
            } else {
                e(
                    Reason::OutOfMemory,
                    format!("{sc} of {} failed: the kernel found no room for the mapping ({text})", human_bytes(want)),
                    None,
                    Some("not a /dev/shm size: look at the process's memory and address-space limits".into()),
                )
            }
        }
        libc::ENOMEM => match (l.memcg_limit, l.memcg_usage) {
            (Some(max), used) => e(
                Reason::MemcgLimit,
                format!(
                    "{sc} on tmpfs failed: its memory cgroup is at its limit of {} (tmpfs pages are charged to the cgroup of the process that touches them)",
                    human_bytes(max)
                ),
                limit("memory cgroup limit", Some(max), used),
                Some("raise the container's memory limit by what /dev/shm holds (Kubernetes: resources.limits.memory; an emptyDir medium: Memory counts against it)".into()),
            ),
            (None, _) => e(
                Reason::OutOfMemory,
                format!("{sc} on tmpfs failed: {text} (the system or its memory cgroup had no memory for the pages)"),
                None,
                None,
            ),
        },
        libc::EPERM | libc::EACCES if is_map && c.prot.is_some_and(|p| p & PROT_EXEC != 0) && c.noexec => e(
            Reason::Noexec,
            format!("{sc} with PROT_EXEC failed: the tmpfs is mounted noexec ({text})"),
            None,
            Some("map without PROT_EXEC, or mount the tmpfs without noexec (Docker mounts /dev/shm noexec by default)".into()),
        ),
        libc::EPERM if c.memfd || is_map => e(
            Reason::Sealed,
            format!("{sc} failed: a seal on the file forbids it (F_SEAL_WRITE/F_SEAL_FUTURE_WRITE) ({text})"),
            None,
            Some("map it read-only or MAP_PRIVATE, or do not seal it before mapping".into()),
        ),
        libc::EPERM | libc::EACCES => e(
            Reason::PermissionDenied,
            format!("{sc} failed: the fd does not allow what was asked ({text}; e.g. O_RDONLY with PROT_WRITE|MAP_SHARED)"),
            None,
            Some("open the file with the access the mapping needs (O_RDWR for a shared writable mapping)".into()),
        ),
        libc::EMFILE => e(
            Reason::FdLimit,
            format!(
                "{sc} failed: the process has no fd left (RLIMIT_NOFILE{})",
                l.open_files.map(|n| format!(" {n}")).unwrap_or_default()
            ),
            limit("RLIMIT_NOFILE", l.open_files, l.fds_open),
            Some("raise ulimit -n (docker/podman --ulimit nofile=1048576), or in PyTorch torch.multiprocessing.set_sharing_strategy('file_system'): the default 'file_descriptor' strategy keeps one fd per shared tensor".into()),
        ),
        libc::ENFILE => e(
            Reason::SystemFdLimit,
            format!("{sc} failed: the system's open file table is full (fs.file-max)"),
            limit("fs.file-max", None, None),
            Some("raise sysctl fs.file-max".into()),
        ),
        libc::EINVAL => e(
            Reason::InvalidArgument,
            format!("{sc} failed: {text} (a misaligned offset, a zero length, or flags the file does not support)"),
            None,
            None,
        ),
        _ => e(Reason::Other, format!("{sc} on tmpfs failed: {text}"), None, None),
    }
}

/// An OOM kill in words: (", in memory cgroup X: limit L, U in use, S of
/// it shmem", the fix).
pub(super) fn oom_words(m: &crate::host::memcg::Memcg, shmem_rss: u64) -> (String, String) {
    let shmem = m.shmem_bytes.unwrap_or(shmem_rss);
    let Some(limit) = m.limit_bytes else {
        return (
            format!(
                "; its memory cgroup {} has no limit of its own ({} in use, {} of it shmem): a parent cgroup's or the node's memory ran out",
                m.path,
                human_bytes(m.usage_bytes),
                human_bytes(shmem)
            ),
            "find the limit that ran out (the pod's, or the node's memory), and count /dev/shm against it".into(),
        );
    };
    let other = m.usage_bytes.saturating_sub(shmem);
    (
        format!(
            "; its memory cgroup {} allows {}, and had {} in use, {} of it shmem (/dev/shm, memfd)",
            m.path,
            human_bytes(limit),
            human_bytes(m.usage_bytes),
            human_bytes(shmem)
        ),
        format!(
            "raise the memory limit above what the job keeps in shared memory plus its other {} (now {}; the {} of shmem at the kill was still growing), or cap /dev/shm below {} (the limit less the rest) so that it fills with a clear ENOSPC before the cgroup does; a Kubernetes Memory emptyDir counts against the pod's limit (since 1.32 it is sized min(sizeLimit, pod limit))",
            human_bytes(other),
            human_bytes(limit),
            human_bytes(shmem),
            human_bytes(limit.saturating_sub(other))
        ),
    )
}

/// What to do about a CUDA IPC error: never a bigger /dev/shm.
pub(super) fn cuda_fix(call: crate::event::CudaCall, error: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn call(syscall: Syscall, errno: i32, limits: &Limits) -> Call<'_> {
        Call {
            syscall,
            errno,
            prot: None,
            bytes: Some(8 * MIB),
            offset: Some(0),
            memfd: false,
            noexec: false,
            free_bytes: Some(60 * MIB),
            inodes_free: Some(1000),
            limits,
        }
    }

    #[test]
    fn only_a_tmpfs_out_of_pages_or_inodes_ran_out() {
        let none = Limits::default();
        let full = explain(&call(Syscall::Fallocate, libc::ENOSPC, &none));
        assert_eq!(full.reason, Reason::TmpfsFull);
        assert!(full.reason.tmpfs_ran_out());
        let mut c = call(Syscall::Openat, libc::ENOSPC, &none);
        c.inodes_free = Some(0);
        assert_eq!(explain(&c).reason, Reason::TmpfsInodes);
        // mmap ENOMEM under RLIMIT_AS on an empty /dev/shm.
        let as_limit = Limits {
            address_space: Some(512 * MIB),
            vm_bytes: Some(506 * MIB),
            ..Default::default()
        };
        let x = explain(&call(Syscall::Mmap, libc::ENOMEM, &as_limit));
        assert_eq!(x.reason, Reason::AddressSpaceLimit);
        assert!(!x.reason.tmpfs_ran_out());
        assert_eq!(x.limit.as_ref().unwrap().value, Some(512 * MIB));
        assert!(x.fix.unwrap().contains("ulimit -v"));
        let maps = Limits {
            map_count: Some(65530),
            max_map_count: Some(65530),
            ..Default::default()
        };
        assert_eq!(
            explain(&call(Syscall::Mmap, libc::ENOMEM, &maps)).reason,
            Reason::MapCountLimit
        );
        assert_eq!(
            explain(&call(Syscall::Mmap, libc::ENOMEM, &none)).reason,
            Reason::OutOfMemory
        );
    }

    #[test]
    fn permissions_seals_sizes_fds_and_cgroups_say_what_they_are() {
        let none = Limits::default();
        let mut c = call(Syscall::Mmap, libc::EPERM, &none);
        c.prot = Some(0x5);
        c.noexec = true;
        let x = explain(&c);
        assert_eq!(x.reason, Reason::Noexec);
        assert!(x.fix.unwrap().contains("noexec"));
        c.prot = Some(0x3);
        c.memfd = true;
        assert_eq!(explain(&c).reason, Reason::Sealed);
        let mut c = call(Syscall::Mmap, libc::EACCES, &none);
        c.prot = Some(0x3);
        assert_eq!(explain(&c).reason, Reason::PermissionDenied);
        let fsize = Limits {
            file_size: Some(MIB),
            ..Default::default()
        };
        let x = explain(&call(Syscall::Write, libc::EFBIG, &fsize));
        assert_eq!(x.reason, Reason::FileSizeLimit);
        assert_eq!(x.limit.unwrap().value, Some(MIB));
        let fds = Limits {
            open_files: Some(1024),
            fds_open: Some(1024),
            ..Default::default()
        };
        let x = explain(&call(Syscall::Openat, libc::EMFILE, &fds));
        assert_eq!(x.reason, Reason::FdLimit);
        assert!(x.fix.unwrap().contains("file_system"));
        let memcg = Limits {
            memcg_limit: Some(256 * MIB),
            memcg_usage: Some(256 * MIB),
            ..Default::default()
        };
        let x = explain(&call(Syscall::Fallocate, libc::ENOMEM, &memcg));
        assert_eq!(x.reason, Reason::MemcgLimit);
        assert_eq!(
            explain(&call(Syscall::Fallocate, libc::EINVAL, &none)).reason,
            Reason::InvalidArgument
        );
    }
}
