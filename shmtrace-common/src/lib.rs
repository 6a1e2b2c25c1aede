//! Types shared by the eBPF programs and user space: the event record, the
//! kernel offsets user space hands in, and the map keys and flags.
//!
//! Every layout here is `#[repr(C)]` and read byte-for-byte on both sides:
//! change it in one place and both sides follow.
#![no_std]

/// `f_type` / `s_magic` of tmpfs and shmem.
pub const TMPFS_MAGIC: u64 = 0x0102_1994;
/// Bytes of `comm` (TASK_COMM_LEN).
pub const COMM_LEN: usize = 16;
/// Bytes kept of one dentry name.
pub const NAME_LEN: usize = 64;
/// Bytes kept of a user path (openat) or an exec file name.
pub const PATH_LEN: usize = 128;

pub const SIGBUS: u32 = 7;
pub const EPERM: i64 = 1;
pub const ENOENT: i64 = 2;
pub const ENOMEM: i64 = 12;
pub const EFBIG: i64 = 27;
pub const ENOSPC: i64 = 28;
pub const EDQUOT: i64 = 122;
pub const EMFILE: i64 = 24;
pub const ENFILE: i64 = 23;

/// Value flags in the `TRACED` map (key: tgid).
pub mod traced {
    /// Report this process's events.
    pub const REPORT: u32 = 1;
    /// Trace the processes it forks (set on shmtrace itself while it spawns `run`'s command).
    pub const FOLLOW: u32 = 2;
}

/// Indexes into the per-CPU `LOST` counters.
pub mod lost {
    /// An ordinary event (fork, exec, exit, mmap...) found its ring buffer full.
    pub const EVENT: u32 = 0;
    /// A failure event found its ring buffer full.
    pub const FAILURE: u32 = 1;
    /// A new child could not be added to the traced set (map full).
    pub const TRACED_FULL: u32 = 2;
    /// A failure record held back: its process was over its budget
    /// ([`super::rate`]). Counted per process too, in `FAIL_RATE`.
    pub const RATE_LIMITED: u32 = 3;
    /// A SIGBUS sent by a process (not a fault) held back: over budget.
    pub const SENT_SIGBUS: u32 = 4;
    /// The first failure on a mount found even the reserved ring full.
    pub const FIRST: u32 = 5;
    pub const COUNT: u32 = 6;
}

/// Per-process budgets that keep one process from drowning the others.
pub mod rate {
    /// Length of a budget window.
    pub const WINDOW_NS: u64 = 1_000_000_000;
    /// Failure records a process may send per window; more are counted.
    pub const FAILURES: u32 = 64;
    /// SIGBUS sent by processes (kill, tgkill, raise) reported per target
    /// per window: PyTorch's worker re-raises one; a loop is noise.
    pub const SENT_SIGBUS: u32 = 4;
}

/// One process's budget in a window, and what it had held back in all.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Budget {
    pub window_start_ns: u64,
    pub used: u32,
    pub _pad: u32,
    /// Records held back since tracing began.
    pub suppressed: u64,
}

/// What an [`Event`] records. The meaning of `ret` and `args` depends on it.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A traced process forked a new process. `args[0]` = child pid.
    Fork = 1,
    /// A traced process called execve. `path` = file name, `args[0]` = old pid.
    Exec = 2,
    /// A traced thread exited. `ret` = kernel exit code (status << 8 | signal),
    /// `args[0]` = 1 when the whole thread group is gone.
    Exit = 3,
    /// A SIGBUS was generated for a traced process. `ret` = si_errno,
    /// args: [0] signal, [1] si_code, [2] si_addr, [3] target tgid,
    /// [4] target tid, [5] result | group << 32. The header is the sender.
    SignalGenerate = 4,
    /// A SIGBUS is being delivered. args: [0] signal, [1] si_code,
    /// [2] sa_handler (0 = default action: the process dies).
    SignalDeliver = 5,
    /// A syscall of a traced process failed. `ret` = -errno, `args` = the
    /// syscall's arguments, `file` = the tmpfs file of its fd (when it has one),
    /// `path` = the user path (openat).
    SyscallFail = 6,
    /// A traced process mapped a tmpfs file. `ret` = address, `args` = mmap's
    /// arguments, `file` = the file.
    Map = 7,
    // 8 was Unmap: munmap is no longer hooked (user space checks the
    // mappings it tracks once a second).
    /// A traced process moved or resized a mapping. `ret` = new address,
    /// args: [0] old address, [1] old length, [2] new length.
    Remap = 9,
    /// The OOM killer chose a traced process. `args[0]` = victim pid,
    /// `args[1]` = its shmem RSS in kB (when the kernel reports it).
    OomVictim = 10,
    /// A traced process resized a tmpfs file with ftruncate. `args[1]` = new
    /// size, `file` = the file after it.
    Truncate = 11,
    /// A traced process opened a tmpfs file. `ret` = the new fd, `args` =
    /// the syscall's arguments, `file` = the file, `path` = the user path.
    Open = 12,
    // 13 was Close: closes are no longer hooked (user space checks the
    // fds it tracks once a second).
    /// A traced process received file descriptors (SCM_RIGHTS) with
    /// recvmsg: user space looks at its fds. `args[0]` = control bytes.
    RecvFds = 14,
    /// A CUDA IPC call of a traced process returned an error (a uretprobe
    /// on libcudart or libcuda). `ret` = the error code, `args[0]` = which
    /// call ([`cuda`]).
    CudaIpc = 15,
    /// A traced process removed a shared-memory file: unlink or unlinkat of
    /// a `/dev/shm/` path, or of a name in a tmpfs directory fd. `path` =
    /// the path as given, `args[0]` = the directory fd (unlinkat), `file`
    /// = that directory's tmpfs device (`file.dev`, 0 for a path).
    Unlink = 16,
}

/// The CUDA IPC calls shmtrace watches (`args[0]` of [`EventKind::CudaIpc`]).
pub mod cuda {
    /// libcudart's cudaIpcGetMemHandle.
    pub const GET_MEM_HANDLE: u64 = 1;
    /// libcudart's cudaIpcOpenMemHandle.
    pub const OPEN_MEM_HANDLE: u64 = 2;
    /// libcuda's cuIpcGetMemHandle.
    pub const DRIVER_GET_MEM_HANDLE: u64 = 3;
    /// libcuda's cuIpcOpenMemHandle.
    pub const DRIVER_OPEN_MEM_HANDLE: u64 = 4;
}

impl EventKind {
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::Fork,
            2 => Self::Exec,
            3 => Self::Exit,
            4 => Self::SignalGenerate,
            5 => Self::SignalDeliver,
            6 => Self::SyscallFail,
            7 => Self::Map,
            9 => Self::Remap,
            10 => Self::OomVictim,
            11 => Self::Truncate,
            12 => Self::Open,
            14 => Self::RecvFds,
            15 => Self::CudaIpc,
            16 => Self::Unlink,
            _ => return None,
        })
    }
}

/// A tmpfs file as the kernel saw it when the event happened.
#[repr(C)]
#[derive(Clone, Copy)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct FileInfo {
    /// 1 when this record is filled (the fd was a tmpfs file). 0 with a
    /// non-zero `dev`: only the mount fields are (SIGBUS events).
    pub valid: u32,
    /// Kernel-encoded device (major << 20 | minor) of the tmpfs superblock.
    pub dev: u32,
    pub ino: u64,
    /// i_size in bytes.
    pub size: i64,
    /// i_blocks: 512-byte units actually allocated.
    pub blocks: u64,
    /// 0 once the file is unlinked.
    pub nlink: u32,
    /// Number of '/' steps from the file to the tmpfs root (1 = top level);
    /// 0 when unknown or deeper than the two names kept.
    pub depth: u32,
    /// Size limit of the mount, in pages (0 = unlimited).
    pub fs_max_pages: u64,
    /// Pages in use on the mount (per-CPU counter: approximate).
    pub fs_used_pages: i64,
    /// The file's name and its parent directory's name (NUL-padded).
    pub name: [u8; NAME_LEN],
    pub parent: [u8; NAME_LEN],
}

/// A process's limits and use, read by the kernel at a failure (the
/// process may be gone before user space could ask /proc). Zero in other
/// records; `valid` says it was filled. Limits of `u64::MAX` are unlimited.
#[repr(C)]
#[derive(Clone, Copy)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct ProcLimits {
    pub rlim_as: u64,
    pub rlim_fsize: u64,
    pub rlim_nofile: u64,
    /// mm->total_vm, in pages.
    pub total_vm_pages: u64,
    /// mm->map_count.
    pub map_count: u32,
    pub valid: u32,
    /// The failing fd's mount flags (vfsmount.mnt_flags; MNT_NOEXEC = 4),
    /// when the call was on an fd.
    pub mnt_flags: u32,
    pub _pad: u32,
}

/// The one record every program sends. Fixed size, 8-byte aligned.
#[repr(C)]
#[derive(Clone, Copy)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct Event {
    pub kind: u32,
    /// Syscall number, for syscall events.
    pub syscall: u32,
    /// bpf_ktime_get_ns (CLOCK_MONOTONIC).
    pub ts_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    /// Parent's tgid (real_parent).
    pub ppid: u32,
    /// Mount namespace inode number (0 when unknown).
    pub mnt_ns: u32,
    /// cgroup v2 id of the task.
    pub cgroup_id: u64,
    pub comm: [u8; COMM_LEN],
    pub ret: i64,
    pub args: [u64; 6],
    pub file: FileInfo,
    pub path: [u8; PATH_LEN],
    /// Failure records only.
    pub limits: ProcLimits,
    /// The tgid in the process's own PID namespace (0 when unknown).
    pub ns_tgid: u32,
    pub _pad_end: u32,
    /// The id (kernfs inode) of the memory cgroup the task's pages are
    /// charged to, v1 or v2: tmpfs events and failures only (0 otherwise,
    /// or when unknown). Read in the kernel because the process may be gone
    /// before user space could read /proc/PID/cgroup.
    pub memcg_id: u64,
}

impl Event {
    pub const SIZE: usize = core::mem::size_of::<Event>();
}

// The wire layout, pinned: both sides compile these, so a field added,
// moved or resized on one side fails the build instead of misreading records.
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<FileInfo>() == 184);
    assert!(offset_of!(FileInfo, dev) == 4);
    assert!(offset_of!(FileInfo, ino) == 8);
    assert!(offset_of!(FileInfo, size) == 16);
    assert!(offset_of!(FileInfo, blocks) == 24);
    assert!(offset_of!(FileInfo, nlink) == 32);
    assert!(offset_of!(FileInfo, depth) == 36);
    assert!(offset_of!(FileInfo, fs_max_pages) == 40);
    assert!(offset_of!(FileInfo, fs_used_pages) == 48);
    assert!(offset_of!(FileInfo, name) == 56);
    assert!(offset_of!(FileInfo, parent) == 120);
    assert!(size_of::<ProcLimits>() == 48);
    assert!(size_of::<Event>() == 488);
    assert!(offset_of!(Event, ns_tgid) == 472);
    assert!(offset_of!(Event, memcg_id) == 480);
    assert!(offset_of!(Event, limits) == 424);
    assert!(offset_of!(Event, kind) == 0);
    assert!(offset_of!(Event, syscall) == 4);
    assert!(offset_of!(Event, ts_ns) == 8);
    assert!(offset_of!(Event, tgid) == 16);
    assert!(offset_of!(Event, tid) == 20);
    assert!(offset_of!(Event, ppid) == 24);
    assert!(offset_of!(Event, mnt_ns) == 28);
    assert!(offset_of!(Event, cgroup_id) == 32);
    assert!(offset_of!(Event, comm) == 40);
    assert!(offset_of!(Event, ret) == 56);
    assert!(offset_of!(Event, args) == 64);
    assert!(offset_of!(Event, file) == 112);
    assert!(offset_of!(Event, path) == 296);
    assert!(size_of::<Event>().is_multiple_of(8));
    // Globals handed in by user space: u32 fields only, no padding.
    assert!(size_of::<KernelOffsets>() == 66 * 4);
    assert!(size_of::<SyscallNrs>() == 19 * 4);
    assert!(size_of::<Config>() == 8);
    assert!(size_of::<Budget>() == 24);
};

/// Offsets of kernel struct members, read by user space from
/// /sys/kernel/btf/vmlinux and passed in as a global: Rust eBPF has no CO-RE.
/// [`KernelOffsets::MISSING`] marks a member this kernel lacks; the programs
/// then leave the dependent field zero.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelOffsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_real_parent: u32,
    pub task_files: u32,
    pub task_nsproxy: u32,
    pub task_exit_code: u32,
    pub files_fdt: u32,
    pub fdt_max_fds: u32,
    pub fdt_fd: u32,
    pub file_inode: u32,
    pub file_pos: u32,
    /// file.f_path.dentry
    pub file_dentry: u32,
    /// dentry.d_name.name
    pub dentry_name: u32,
    pub dentry_parent: u32,
    /// dentry.d_inode (a create's new inode, in the trampoline backend)
    pub dentry_inode: u32,
    pub inode_sb: u32,
    pub inode_ino: u32,
    pub inode_size: u32,
    pub inode_nlink: u32,
    pub inode_blocks: u32,
    pub sb_dev: u32,
    pub sb_magic: u32,
    pub sb_fs_info: u32,
    /// shmem_sb_info.max_blocks
    pub sbinfo_max_blocks: u32,
    /// shmem_sb_info.used_blocks.count
    pub sbinfo_used_blocks: u32,
    /// nsproxy.mnt_ns
    pub nsproxy_mnt_ns: u32,
    /// mnt_namespace.ns.inum
    pub mnt_ns_inum: u32,
    /// pt_regs: the six syscall argument registers and the syscall number.
    pub regs_args: [u32; 6],
    pub regs_nr: u32,
    /// task_struct.stack, and where a task's user pt_regs sit above it
    /// (THREAD_SIZE - sizeof(pt_regs)): how kernels before 5.15, which lack
    /// bpf_task_pt_regs, give a syscall's arguments at its exit.
    pub task_stack: u32,
    pub stack_regs: u32,
    /// The first of [`REGS_WINDOW`] words of pt_regs that hold the six
    /// argument registers and orig_ax (x86_64: r10 at 56 to orig_ax at
    /// 120), read in one helper call; MISSING when they do not fit.
    pub regs_window: u32,
    /// Classic tracepoint field offsets, from tracefs format files.
    pub tp_exec_filename: u32,
    pub tp_exec_old_pid: u32,
    pub tp_exit_group_dead: u32,
    pub tp_deliver_sig: u32,
    pub tp_deliver_code: u32,
    pub tp_deliver_handler: u32,
    pub tp_victim_pid: u32,
    /// oom:mark_victim shmem_rss (kB), on kernels that have it.
    pub tp_victim_shmem_rss: u32,
    /// task_struct.signal, signal_struct.rlim (an array of struct rlimit),
    /// task_struct.mm, mm_struct.total_vm and map_count: limits at a failure.
    pub task_signal: u32,
    pub signal_rlim: u32,
    pub task_mm: u32,
    pub mm_total_vm: u32,
    pub mm_map_count: u32,
    /// file.f_path.mnt and vfsmount.mnt_flags: noexec at a failed mmap.
    pub file_mnt: u32,
    pub vfsmount_flags: u32,
    /// mount.mnt (the embedded vfsmount), mount.mnt_parent,
    /// mount.mnt_mountpoint and vfsmount.mnt_root: the failing file's mount
    /// point, read in the kernel (the namespace may be gone by the time
    /// user space could read its mount table).
    pub mount_mnt: u32,
    pub mount_parent: u32,
    pub mount_mountpoint: u32,
    pub vfsmount_root: u32,
    /// task_struct.group_leader, task_struct.thread_pid, pid.level,
    /// pid.numbers and the size of struct upid (upid.nr is first): the
    /// process's pid in its own PID namespace (a container's "pid 9").
    pub task_group_leader: u32,
    pub task_thread_pid: u32,
    pub pid_level: u32,
    pub pid_numbers: u32,
    pub upid_size: u32,
    /// task_struct.cgroups, css_set.subsys[memory_cgrp_id] (the offset of
    /// that slot), cgroup_subsys_state.cgroup, cgroup.kn and kernfs_node.id:
    /// the task's memory cgroup id, in whichever hierarchy memory is on.
    pub task_cgroups: u32,
    pub css_set_memcg: u32,
    pub css_cgroup: u32,
    pub cgroup_kn: u32,
    pub kn_id: u32,
}

/// In a failure record on a tmpfs fd, `path` holds the file's mount point
/// as [`MOUNTPOINT_NAMES`] names of [`MOUNTPOINT_NAME_LEN`] bytes, leaf
/// first ("shm", "dev": /dev/shm); empty when unknown or deeper.
pub const MOUNTPOINT_NAMES: usize = 4;
pub const MOUNTPOINT_NAME_LEN: usize = PATH_LEN / MOUNTPOINT_NAMES;

impl KernelOffsets {
    pub const MISSING: u32 = u32::MAX;
}

/// Syscall numbers of this architecture, passed in as a global.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SyscallNrs {
    pub write: u32,
    pub pwrite64: u32,
    pub writev: u32,
    pub pwritev: u32,
    pub pwritev2: u32,
    pub fallocate: u32,
    pub ftruncate: u32,
    pub open: u32,
    pub openat: u32,
    pub openat2: u32,
    pub creat: u32,
    pub mmap: u32,
    pub mremap: u32,
    pub recvmsg: u32,
    pub sendfile: u32,
    pub splice: u32,
    pub copy_file_range: u32,
    pub unlink: u32,
    pub unlinkat: u32,
}

/// Run-time switches, passed in as a global.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    /// Trace every process (node-wide), not only those in `TRACED`.
    pub all_processes: u32,
    /// shmtrace's own tgid: never traced, whatever the mode (its own
    /// output files on a full tmpfs would feed back).
    pub self_tgid: u32,
}

/// Words of pt_regs read at once by kernels before 5.15 (see
/// [`KernelOffsets::regs_window`]).
pub const REGS_WINDOW: usize = 9;

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain-old-data, repr(C), no padding with meaning.
    unsafe impl aya::Pod for super::KernelOffsets {}
    unsafe impl aya::Pod for super::SyscallNrs {}
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::Budget {}
}
