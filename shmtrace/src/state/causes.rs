//! Why a call failed, from its errno and what surrounded it: a tmpfs out
//! of pages or inodes is one cause among many. An mmap refused by
//! RLIMIT_AS, a noexec mount or a seal, a write past RLIMIT_FSIZE, a memory
//! cgroup at its limit, a process out of fds: each has its own fix, and a
//! bigger /dev/shm is the fix only for the first two. Here the cause is a
//! typed fact with the numbers that tell it; `analysis::causes` words it.

use serde::Serialize;

use crate::{
    event::{CudaCall, Syscall},
    host::Limits,
};

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
    /// Every reason, in declaration order (the report schema's values).
    pub const ALL: [Self; 19] = [
        Self::TmpfsFull,
        Self::TmpfsInodes,
        Self::Quota,
        Self::AddressSpaceLimit,
        Self::MapCountLimit,
        Self::OutOfMemory,
        Self::MemcgLimit,
        Self::OomKill,
        Self::Noexec,
        Self::Sealed,
        Self::PermissionDenied,
        Self::FileSizeLimit,
        Self::FdLimit,
        Self::SystemFdLimit,
        Self::InvalidArgument,
        Self::HardwareError,
        Self::CudaIpc,
        Self::SegmentGone,
        Self::Other,
    ];

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
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Limit {
    /// "RLIMIT_AS", "vm.max_map_count", "memory.max", ...
    pub name: &'static str,
    /// Its value, in the unit its name says (bytes, mappings, fds).
    pub value: Option<u64>,
    /// How much of it was in use (address space, mappings, fds, memory).
    pub used: Option<u64>,
}

/// Why a failure happened: the cause by its facts, worded by analysis.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Cause {
    /// SIGBUS on a tmpfs page: the mount had (almost) no free page.
    PageFull,
    /// SIGBUS on a tmpfs page, but the mount had room when measured
    /// (another process freed space since).
    PageFreedSince,
    /// SIGBUS on a tmpfs page, the mount's use unknown.
    PageUnknown,
    /// Another SIGBUS code on a tmpfs mapping (a machine check...).
    SigbusCode(i32),
    /// Creating a file at the tmpfs inode limit (`total` inodes).
    CreateAtInodeLimit {
        total: Option<u64>,
    },
    /// Creating a file failed with ENOSPC, inodes left.
    CreateFailed {
        errno: i32,
    },
    /// A write, allocation or mapping found the tmpfs full: what it asked
    /// for and what was free.
    Full {
        syscall: Syscall,
        errno: i32,
        asked: Option<u64>,
        free: Option<u64>,
    },
    Quota {
        syscall: Syscall,
        errno: i32,
    },
    /// Past RLIMIT_FSIZE (`max`).
    FileSizeLimit {
        syscall: Syscall,
        max: u64,
    },
    FileTooLarge {
        syscall: Syscall,
        errno: i32,
    },
    /// mmap of `want` past RLIMIT_AS `max` with `vm` mapped already.
    AddressSpace {
        syscall: Syscall,
        want: u64,
        max: u64,
        vm: u64,
    },
    /// `count` mappings at vm.max_map_count `max`.
    MapCount {
        syscall: Syscall,
        count: u64,
        max: u64,
    },
    NoRoomForMapping {
        syscall: Syscall,
        want: u64,
        errno: i32,
    },
    /// Its memory cgroup at its limit `max`.
    MemcgLimit {
        syscall: Syscall,
        max: u64,
    },
    NoMemory {
        syscall: Syscall,
        errno: i32,
    },
    Noexec {
        syscall: Syscall,
        errno: i32,
    },
    Sealed {
        syscall: Syscall,
        errno: i32,
    },
    PermissionDenied {
        syscall: Syscall,
        errno: i32,
    },
    /// No fd left under RLIMIT_NOFILE `max`.
    FdLimit {
        syscall: Syscall,
        max: Option<u64>,
    },
    SystemFdLimit {
        syscall: Syscall,
    },
    InvalidArgument {
        syscall: Syscall,
        errno: i32,
    },
    OtherErrno {
        syscall: Syscall,
        errno: i32,
    },
    /// The OOM killer chose it, holding `shmem_rss` of shared memory (its
    /// memory cgroup is the failure's `memcg`).
    OomKill {
        shmem_rss: u64,
    },
    /// A CUDA IPC call returned `code`.
    CudaIpc {
        call: CudaCall,
        code: i32,
    },
    /// An open found its segment gone (who removed it: `removed_by`).
    SegmentGone,
    #[default]
    Unknown,
}

/// A cause, its name and the limit it ran into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explained {
    pub reason: Reason,
    pub cause: Cause,
    pub limit: Option<Limit>,
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
    /// Free bytes, and inodes (free and in all), of its mount at the failure.
    pub free_bytes: Option<u64>,
    pub inodes_free: Option<u64>,
    pub inodes: Option<u64>,
    pub limits: &'a Limits,
}

const PROT_EXEC: u64 = 0x4;
use crate::units::MIB;

pub fn explain(c: &Call) -> Explained {
    let syscall = c.syscall;
    let errno = c.errno;
    let is_map = matches!(syscall, Syscall::Mmap | Syscall::Mremap);
    let l = c.limits;
    let limit = |name, value, used| Some(Limit { name, value, used });
    let e = |reason, cause, limit| Explained {
        reason,
        cause,
        limit,
    };
    match errno {
        libc::ENOSPC if syscall.is_open() => match c.inodes_free {
            Some(0) | Some(1) => e(
                Reason::TmpfsInodes,
                Cause::CreateAtInodeLimit { total: c.inodes },
                None,
            ),
            _ => e(Reason::TmpfsFull, Cause::CreateFailed { errno }, None),
        },
        libc::ENOSPC => e(
            Reason::TmpfsFull,
            Cause::Full {
                syscall,
                errno,
                asked: c.bytes,
                free: c.free_bytes,
            },
            None,
        ),
        libc::EDQUOT => e(Reason::Quota, Cause::Quota { syscall, errno }, None),
        libc::EFBIG => {
            let end = c.offset.unwrap_or(0).saturating_add(c.bytes.unwrap_or(0));
            match l.file_size {
                Some(max) => e(
                    Reason::FileSizeLimit,
                    Cause::FileSizeLimit { syscall, max },
                    limit("RLIMIT_FSIZE", Some(max), Some(end)),
                ),
                None => e(
                    Reason::FileSizeLimit,
                    Cause::FileTooLarge { syscall, errno },
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
                    Cause::AddressSpace {
                        syscall,
                        want,
                        max,
                        vm,
                    },
                    limit("RLIMIT_AS", Some(max), Some(vm)),
                )
            } else if let (Some(max), Some(n)) = (l.max_map_count, l.map_count)
                && n + 2 >= max
            {
                e(
                    Reason::MapCountLimit,
                    Cause::MapCount {
                        syscall,
                        count: n,
                        max,
                    },
                    limit("vm.max_map_count", Some(max), Some(n)),
                )
            } else {
                e(
                    Reason::OutOfMemory,
                    Cause::NoRoomForMapping {
                        syscall,
                        want,
                        errno,
                    },
                    None,
                )
            }
        }
        libc::ENOMEM => match (l.memcg_limit, l.memcg_usage) {
            (Some(max), used) => e(
                Reason::MemcgLimit,
                Cause::MemcgLimit { syscall, max },
                limit("memory cgroup limit", Some(max), used),
            ),
            (None, _) => e(
                Reason::OutOfMemory,
                Cause::NoMemory { syscall, errno },
                None,
            ),
        },
        libc::EPERM | libc::EACCES
            if is_map && c.prot.is_some_and(|p| p & PROT_EXEC != 0) && c.noexec =>
        {
            e(Reason::Noexec, Cause::Noexec { syscall, errno }, None)
        }
        libc::EPERM if c.memfd || is_map => {
            e(Reason::Sealed, Cause::Sealed { syscall, errno }, None)
        }
        libc::EPERM | libc::EACCES => e(
            Reason::PermissionDenied,
            Cause::PermissionDenied { syscall, errno },
            None,
        ),
        libc::EMFILE => e(
            Reason::FdLimit,
            Cause::FdLimit {
                syscall,
                max: l.open_files,
            },
            limit("RLIMIT_NOFILE", l.open_files, l.fds_open),
        ),
        libc::ENFILE => e(
            Reason::SystemFdLimit,
            Cause::SystemFdLimit { syscall },
            limit("fs.file-max", None, None),
        ),
        libc::EINVAL => e(
            Reason::InvalidArgument,
            Cause::InvalidArgument { syscall, errno },
            None,
        ),
        _ => e(Reason::Other, Cause::OtherErrno { syscall, errno }, None),
    }
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
            inodes: Some(2000),
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
        assert_eq!(
            x.cause,
            Cause::AddressSpace {
                syscall: Syscall::Mmap,
                want: 8 * MIB,
                max: 512 * MIB,
                vm: 506 * MIB
            }
        );
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
        assert_eq!(x.limit.unwrap().used, Some(1024));
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
