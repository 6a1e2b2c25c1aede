//! The typed events: what the kernel told us, decoded once from the wire
//! record (`capture::decode`). Everything downstream (state, analysis,
//! output) reads these named fields; nothing touches the raw `args`.

use std::fmt;

/// A user-space address (mapping start, fault address).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Addr(pub u64);

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// In JSON as the kernel and gdb print it: "0x7f00...".
impl serde::Serialize for Addr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Kernel-encoded device number of a superblock (major << 20 | minor).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dev(pub u32);

impl Dev {
    pub fn new(major: u32, minor: u32) -> Self {
        Self((major << 20) | minor)
    }
}

impl fmt::Display for Dev {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.0 >> 20, self.0 & 0xf_ffff)
    }
}

/// In JSON as mountinfo prints it: "0:40".
impl serde::Serialize for Dev {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A tmpfs file: device and inode.
pub type FileKey = (Dev, u64);

/// The syscalls the programs report on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Syscall {
    Write,
    Pwrite64,
    Writev,
    Pwritev,
    Pwritev2,
    Fallocate,
    Ftruncate,
    Open,
    Openat,
    Openat2,
    Creat,
    Mmap,
    Mremap,
    Recvmsg,
    Sendfile,
    Splice,
    CopyFileRange,
}

impl serde::Serialize for Syscall {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl Syscall {
    /// Every syscall reported on, in declaration order.
    pub const ALL: [Self; 17] = [
        Self::Write,
        Self::Pwrite64,
        Self::Writev,
        Self::Pwritev,
        Self::Pwritev2,
        Self::Fallocate,
        Self::Ftruncate,
        Self::Open,
        Self::Openat,
        Self::Openat2,
        Self::Creat,
        Self::Mmap,
        Self::Mremap,
        Self::Recvmsg,
        Self::Sendfile,
        Self::Splice,
        Self::CopyFileRange,
    ];

    pub fn is_open(self) -> bool {
        matches!(
            self,
            Self::Open | Self::Openat | Self::Openat2 | Self::Creat
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Write => "write",
            Self::Pwrite64 => "pwrite64",
            Self::Writev => "writev",
            Self::Pwritev => "pwritev",
            Self::Pwritev2 => "pwritev2",
            Self::Fallocate => "fallocate",
            Self::Ftruncate => "ftruncate",
            Self::Open => "open",
            Self::Openat => "openat",
            Self::Openat2 => "openat2",
            Self::Creat => "creat",
            Self::Mmap => "mmap",
            Self::Mremap => "mremap",
            Self::Recvmsg => "recvmsg",
            Self::Sendfile => "sendfile",
            Self::Splice => "splice",
            Self::CopyFileRange => "copy_file_range",
        }
    }
}

/// Who and when: the header every record carries.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Header {
    /// bpf_ktime_get_ns (CLOCK_MONOTONIC).
    pub ts_ns: u64,
    /// The process (tgid) the event happened in.
    pub pid: u32,
    pub tid: u32,
    pub ppid: u32,
    /// The pid in its own PID namespace (0 when unknown).
    pub ns_pid: u32,
    /// Mount namespace inode number (0 when unknown).
    pub mnt_ns: u32,
    /// cgroup v2 id.
    pub cgroup_id: u64,
    /// The memory cgroup's id (kernfs inode, in the hierarchy memory is on)
    /// as the kernel read it: failures and tmpfs events that woke user
    /// space; 0 elsewhere or when unknown.
    pub memcg_id: u64,
    /// Escaped.
    pub comm: String,
}

/// How full a tmpfs mount was when the kernel wrote the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MountPages {
    pub dev: Dev,
    /// Size limit in pages (0: unlimited).
    pub max_pages: u64,
    pub used_pages: u64,
}

/// A tmpfs file as the kernel saw it at the event.
#[derive(Clone, Debug, PartialEq)]
pub struct FileRef {
    pub dev: Dev,
    pub ino: u64,
    /// Escaped; "name", "parent/name" or ".../parent/name".
    pub name: Option<String>,
    pub size: i64,
    /// Bytes of allocated pages (i_blocks * 512).
    pub allocated: u64,
    pub unlinked: bool,
    pub mount: MountPages,
}

impl FileRef {
    pub fn key(&self) -> FileKey {
        (self.dev, self.ino)
    }
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitStatus {
    /// exit() code when it exited normally.
    pub code: Option<i32>,
    /// The signal that killed it.
    pub signal: Option<i32>,
    pub core_dumped: bool,
}

impl ExitStatus {
    /// From the kernel's exit_code (status << 8 | signal | core << 7).
    pub fn from_kernel(raw: i32) -> Self {
        let sig = raw & 0x7f;
        Self {
            code: (sig == 0).then_some((raw >> 8) & 0xff),
            signal: (sig != 0).then_some(sig),
            core_dumped: raw & 0x80 != 0,
        }
    }
}

/// What a SIGBUS delivery runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handler {
    /// The default action: the process dies.
    Default,
    Ignore,
    Function(u64),
}

/// What a failed syscall was doing, from its arguments.
#[derive(Clone, Debug, PartialEq)]
pub enum FailedCall {
    /// open/openat/openat2/creat: a file could not be created.
    Open {
        syscall: Syscall,
        /// None: relative to the working directory.
        dirfd: Option<i32>,
        /// The path as the process passed it (raw, lossy UTF-8; escape to show).
        path: String,
    },
    /// mremap of a mapping.
    Mremap {
        old_addr: Addr,
        old_len: u64,
        new_len: u64,
    },
    /// A call on a tmpfs fd: write, pwrite64, writev, pwritev(2), fallocate,
    /// ftruncate, mmap.
    OnFile {
        syscall: Syscall,
        fd: i32,
        /// Where in the file (the fd's position for write/writev).
        offset: Option<u64>,
        /// How many bytes it asked for (length, count, new size).
        bytes: Option<u64>,
        /// mmap's protection bits.
        prot: Option<u64>,
        /// The file's mount point as the kernel saw it (escaped), for when
        /// its namespace's mount table cannot be read any more.
        mountpoint: Option<String>,
        file: FileRef,
    },
}

impl FailedCall {
    pub fn syscall(&self) -> Syscall {
        match self {
            Self::Open { syscall, .. } | Self::OnFile { syscall, .. } => *syscall,
            Self::Mremap { .. } => Syscall::Mremap,
        }
    }
}

/// A failing process's limits, read by the kernel at the failure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelLimits {
    /// Soft RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NOFILE (None: unlimited).
    pub address_space: Option<u64>,
    pub file_size: Option<u64>,
    pub open_files: Option<u64>,
    /// Its address space and mappings then.
    pub vm_bytes: u64,
    pub map_count: u64,
}

/// Mount flag of the failing fd's mount (vfsmount.mnt_flags).
pub const MNT_NOEXEC: u32 = 4;

/// One event, decoded.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A traced process forked `child`.
    Fork { h: Header, child: u32 },
    /// A traced process called execve.
    Exec {
        h: Header,
        /// Escaped.
        filename: String,
        old_pid: u32,
    },
    /// A traced process (the whole thread group) exited.
    Exit { h: Header, status: ExitStatus },
    /// A SIGBUS was generated for a traced process. The header is the sender
    /// (the faulting thread itself for a page fault).
    Sigbus {
        h: Header,
        target: u32,
        target_tid: u32,
        si_code: i32,
        si_errno: i32,
        addr: Addr,
        /// The tmpfs the target last mapped, as full as it was at that instant.
        mount: Option<MountPages>,
    },
    /// A SIGBUS is being delivered.
    SigbusDelivered {
        h: Header,
        si_code: i32,
        handler: Handler,
    },
    /// A watched syscall failed.
    SyscallFailed {
        h: Header,
        errno: i32,
        call: FailedCall,
        /// Its limits at that moment (ENOMEM, EFBIG, EMFILE only).
        limits: Option<KernelLimits>,
        /// The fd's mount flags, read by the kernel (0: not on an fd).
        mnt_flags: u32,
    },
    /// A traced process mapped a tmpfs file.
    Mapped {
        h: Header,
        addr: Addr,
        len: u64,
        prot: u64,
        flags: u64,
        offset: u64,
        file: FileRef,
        /// The file's mount point, read by the kernel at the mmap.
        mountpoint: Option<String>,
    },
    Remapped {
        h: Header,
        old_addr: Addr,
        old_len: u64,
        new_addr: Addr,
        new_len: u64,
    },
    /// The OOM killer chose a traced process.
    OomVictim {
        h: Header,
        victim: u32,
        /// Its shmem RSS in bytes, when the kernel reports it.
        shmem_rss: u64,
    },
    /// A tmpfs file was resized with ftruncate.
    Truncated {
        h: Header,
        fd: i32,
        length: u64,
        file: FileRef,
    },
    /// A traced process created (O_CREAT) and opened a tmpfs file.
    Opened {
        h: Header,
        syscall: Syscall,
        /// None where the hook ran before the open had an fd (the
        /// trampoline backend's create hook): the fd rescan finds it.
        fd: Option<i32>,
        flags: u64,
        file: FileRef,
    },
    /// A recvmsg returned control data: it may have received fds.
    FdsReceived { h: Header, control_bytes: u64 },
    /// A /dev/shm file removed (unlink, unlinkat).
    Unlinked {
        h: Header,
        /// The path as the process passed it (raw, lossy UTF-8).
        path: String,
        /// unlinkat's directory fd, when not the working directory.
        dirfd: Option<i32>,
        /// That directory's tmpfs device (a name relative to it).
        dir_dev: Option<Dev>,
    },
    /// A CUDA IPC call returned an error.
    CudaIpcFailed {
        h: Header,
        call: CudaCall,
        code: i32,
    },
}

/// The CUDA IPC calls shmtrace watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CudaCall {
    GetMemHandle,
    OpenMemHandle,
    DriverGetMemHandle,
    DriverOpenMemHandle,
}

impl serde::Serialize for CudaCall {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl CudaCall {
    pub const ALL: [Self; 4] = [
        Self::GetMemHandle,
        Self::OpenMemHandle,
        Self::DriverGetMemHandle,
        Self::DriverOpenMemHandle,
    ];

    pub fn from_wire(v: u64) -> Option<Self> {
        use shmtrace_common::cuda;
        Some(match v {
            cuda::GET_MEM_HANDLE => Self::GetMemHandle,
            cuda::OPEN_MEM_HANDLE => Self::OpenMemHandle,
            cuda::DRIVER_GET_MEM_HANDLE => Self::DriverGetMemHandle,
            cuda::DRIVER_OPEN_MEM_HANDLE => Self::DriverOpenMemHandle,
            _ => return None,
        })
    }

    /// The library the call is in, as failures list it.
    pub fn library(self) -> &'static str {
        match self {
            Self::GetMemHandle | Self::OpenMemHandle => "libcudart",
            Self::DriverGetMemHandle | Self::DriverOpenMemHandle => "libcuda",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::GetMemHandle => "cudaIpcGetMemHandle",
            Self::OpenMemHandle => "cudaIpcOpenMemHandle",
            Self::DriverGetMemHandle => "cuIpcGetMemHandle",
            Self::DriverOpenMemHandle => "cuIpcOpenMemHandle",
        }
    }

    /// The error's name: cudaError_t for the runtime's calls, CUresult
    /// for the driver's (the codes that matter here; others by number).
    pub fn error_name(self, code: i32) -> String {
        let runtime = matches!(self, Self::GetMemHandle | Self::OpenMemHandle);
        let name = match (runtime, code) {
            (true, 1) => "cudaErrorInvalidValue",
            (true, 2) => "cudaErrorMemoryAllocation",
            (true, 3) => "cudaErrorInitializationError",
            (true, 35) => "cudaErrorInsufficientDriver",
            (true, 100) => "cudaErrorNoDevice",
            (true, 201) => "cudaErrorDeviceUninitialized",
            (true, 400) => "cudaErrorInvalidResourceHandle",
            (true, 401) => "cudaErrorIllegalState",
            (true, 801) => "cudaErrorNotSupported",
            (true, 999) => "cudaErrorUnknown",
            (false, 1) => "CUDA_ERROR_INVALID_VALUE",
            (false, 2) => "CUDA_ERROR_OUT_OF_MEMORY",
            (false, 3) => "CUDA_ERROR_NOT_INITIALIZED",
            (false, 100) => "CUDA_ERROR_NO_DEVICE",
            (false, 201) => "CUDA_ERROR_INVALID_CONTEXT",
            (false, 400) => "CUDA_ERROR_INVALID_HANDLE",
            (false, 801) => "CUDA_ERROR_NOT_SUPPORTED",
            (false, 999) => "CUDA_ERROR_UNKNOWN",
            _ => return format!("error {code}"),
        };
        name.to_string()
    }
}

/// The kind of an [`Event`], without its data: what the evidence and the
/// counters keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Fork,
    Exec,
    Exit,
    Sigbus,
    SigbusDelivered,
    SyscallFailed,
    Mapped,
    Remapped,
    OomVictim,
    Truncated,
    Opened,
    FdsReceived,
    Unlinked,
    CudaIpcFailed,
}

impl Kind {
    /// Its name in `--events`, the report's counters and evidence lines.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Fork => "fork",
            Kind::Exec => "exec",
            Kind::Exit => "exit",
            Kind::Sigbus => "signal_generate",
            Kind::SigbusDelivered => "signal_deliver",
            Kind::SyscallFailed => "syscall_error",
            Kind::Mapped => "mmap",
            Kind::Remapped => "mremap",
            Kind::OomVictim => "oom_victim",
            Kind::Truncated => "ftruncate",
            Kind::Opened => "open",
            Kind::FdsReceived => "recvmsg_fds",
            Kind::Unlinked => "unlink",
            Kind::CudaIpcFailed => "cuda_ipc_error",
        }
    }
}

impl Event {
    pub fn header(&self) -> &Header {
        match self {
            Self::Fork { h, .. }
            | Self::Exec { h, .. }
            | Self::Exit { h, .. }
            | Self::Sigbus { h, .. }
            | Self::SigbusDelivered { h, .. }
            | Self::SyscallFailed { h, .. }
            | Self::Mapped { h, .. }
            | Self::Remapped { h, .. }
            | Self::OomVictim { h, .. }
            | Self::Truncated { h, .. }
            | Self::Opened { h, .. }
            | Self::FdsReceived { h, .. }
            | Self::Unlinked { h, .. }
            | Self::CudaIpcFailed { h, .. } => h,
        }
    }

    /// Which kind of event it is.
    pub fn kind(&self) -> Kind {
        match self {
            Self::Fork { .. } => Kind::Fork,
            Self::Exec { .. } => Kind::Exec,
            Self::Exit { .. } => Kind::Exit,
            Self::Sigbus { .. } => Kind::Sigbus,
            Self::SigbusDelivered { .. } => Kind::SigbusDelivered,
            Self::SyscallFailed { .. } => Kind::SyscallFailed,
            Self::Mapped { .. } => Kind::Mapped,
            Self::Remapped { .. } => Kind::Remapped,
            Self::OomVictim { .. } => Kind::OomVictim,
            Self::Truncated { .. } => Kind::Truncated,
            Self::Opened { .. } => Kind::Opened,
            Self::FdsReceived { .. } => Kind::FdsReceived,
            Self::Unlinked { .. } => Kind::Unlinked,
            Self::CudaIpcFailed { .. } => Kind::CudaIpcFailed,
        }
    }

    /// The name used in `--events` and the report's counters.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The tmpfs file the record describes, if any.
    pub fn file(&self) -> Option<&FileRef> {
        match self {
            Self::Mapped { file, .. }
            | Self::Truncated { file, .. }
            | Self::Opened { file, .. } => Some(file),
            Self::SyscallFailed {
                call: FailedCall::OnFile { file, .. },
                ..
            } => Some(file),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_and_killing_signals_are_told_apart() {
        assert_eq!(
            ExitStatus::from_kernel(3 << 8),
            ExitStatus {
                code: Some(3),
                signal: None,
                core_dumped: false
            }
        );
        // SIGBUS with a core dump.
        assert_eq!(
            ExitStatus::from_kernel(7 | 0x80),
            ExitStatus {
                code: None,
                signal: Some(7),
                core_dumped: true
            }
        );
    }

    #[test]
    fn devices_and_addresses_print_and_serialize_as_the_kernel_does() {
        let d = Dev::new(0, 40);
        assert_eq!((d.to_string(), d.0), ("0:40".to_string(), 40));
        assert_eq!(Dev::new(259, 3).to_string(), "259:3");
        assert_eq!(serde_json::to_value(d).unwrap(), "0:40");
        assert_eq!(
            serde_json::to_value(Addr(0x7f00_0000_1000)).unwrap(),
            "0x7f0000001000"
        );
    }

    #[test]
    fn syscalls_and_cuda_calls_go_by_their_names() {
        assert!(Syscall::Openat2.is_open() && Syscall::Creat.is_open());
        assert!(!Syscall::Fallocate.is_open());
        assert_eq!(
            serde_json::to_value(Syscall::CopyFileRange).unwrap(),
            "copy_file_range"
        );
        assert_eq!(
            serde_json::to_value(CudaCall::OpenMemHandle).unwrap(),
            "cudaIpcOpenMemHandle"
        );
        assert_eq!(
            CudaCall::GetMemHandle.error_name(2),
            "cudaErrorMemoryAllocation"
        );
        assert_eq!(
            CudaCall::DriverGetMemHandle.error_name(2),
            "CUDA_ERROR_OUT_OF_MEMORY"
        );
        assert_eq!(
            CudaCall::DriverOpenMemHandle.error_name(12345),
            "error 12345"
        );
        assert_eq!(CudaCall::from_wire(999_999), None);
    }

    #[test]
    fn events_give_their_header_name_and_file() {
        let file = FileRef {
            dev: Dev(40),
            ino: 7,
            name: Some("seg".into()),
            size: 0,
            allocated: 0,
            unlinked: false,
            mount: MountPages {
                dev: Dev(40),
                max_pages: 0,
                used_pages: 0,
            },
        };
        let h = Header {
            pid: 5,
            ..Default::default()
        };
        let opened = Event::Opened {
            h: h.clone(),
            syscall: Syscall::Openat,
            fd: Some(3),
            flags: 0,
            file: file.clone(),
        };
        assert_eq!((opened.name(), opened.header().pid), ("open", 5));
        assert_eq!(opened.file().map(FileRef::key), Some((Dev(40), 7)));
        let received = Event::FdsReceived {
            h,
            control_bytes: 24,
        };
        assert_eq!((received.name(), received.file()), ("recvmsg_fds", None));
        let failed = FailedCall::Mremap {
            old_addr: Addr(0),
            old_len: 1,
            new_len: 2,
        };
        assert_eq!(failed.syscall(), Syscall::Mremap);
    }
}
