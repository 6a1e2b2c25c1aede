//! Reading kernel structs at offsets user space found in BTF.

use aya_ebpf::helpers::{
    bpf_get_current_task, bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes,
};
use shmtrace_common::{Config, FileInfo, KernelOffsets, SyscallNrs, TMPFS_MAGIC};

pub(crate) const MISSING: u32 = KernelOffsets::MISSING;
const M: u32 = MISSING;

// Overridden by the loader (EbpfLoader::override_global); the values here only
// say "unknown". Read with read_volatile so the compiler cannot fold them.
// SAFETY (no_mangle): a unique symbol name, looked up by the loader.
#[unsafe(no_mangle)]
static OFFSETS: KernelOffsets = KernelOffsets {
    task_pid: M,
    task_tgid: M,
    task_real_parent: M,
    task_files: M,
    task_nsproxy: M,
    task_exit_code: M,
    files_fdt: M,
    fdt_max_fds: M,
    fdt_fd: M,
    file_inode: M,
    file_pos: M,
    file_dentry: M,
    dentry_name: M,
    dentry_parent: M,
    dentry_inode: M,
    inode_sb: M,
    inode_ino: M,
    inode_size: M,
    inode_nlink: M,
    inode_blocks: M,
    sb_dev: M,
    sb_magic: M,
    sb_fs_info: M,
    sbinfo_max_blocks: M,
    sbinfo_used_blocks: M,
    nsproxy_mnt_ns: M,
    mnt_ns_inum: M,
    regs_args: [M; 6],
    regs_nr: M,
    task_stack: M,
    stack_regs: M,
    regs_window: M,
    tp_exec_filename: M,
    tp_exec_old_pid: M,
    tp_exit_group_dead: M,
    tp_deliver_sig: M,
    tp_deliver_code: M,
    tp_deliver_handler: M,
    tp_victim_pid: M,
    tp_victim_shmem_rss: M,
    task_signal: M,
    signal_rlim: M,
    task_mm: M,
    mm_total_vm: M,
    mm_map_count: M,
    file_mnt: M,
    vfsmount_flags: M,
    mount_mnt: M,
    mount_parent: M,
    mount_mountpoint: M,
    vfsmount_root: M,
    task_group_leader: M,
    task_thread_pid: M,
    pid_level: M,
    pid_numbers: M,
    upid_size: M,
    task_cgroups: M,
    css_set_memcg: M,
    css_cgroup: M,
    cgroup_kn: M,
    kn_id: M,
};

// SAFETY (no_mangle): a unique symbol name, looked up by the loader.
#[unsafe(no_mangle)]
static NRS: SyscallNrs = SyscallNrs {
    write: M,
    pwrite64: M,
    writev: M,
    pwritev: M,
    pwritev2: M,
    fallocate: M,
    ftruncate: M,
    open: M,
    openat: M,
    openat2: M,
    creat: M,
    mmap: M,
    mremap: M,
    recvmsg: M,
    sendfile: M,
    splice: M,
    copy_file_range: M,
    unlink: M,
    unlinkat: M,
};

// SAFETY (no_mangle): a unique symbol name, looked up by the loader.
#[unsafe(no_mangle)]
static CONFIG: Config = Config {
    all_processes: 0,
    self_tgid: 0,
};

/// One offset from the loader-provided table.
macro_rules! off {
    ($field:ident) => {
        // SAFETY: a volatile read of a field of a static: valid and aligned.
        unsafe { core::ptr::read_volatile(&crate::kernel::offsets().$field) }
    };
    ($field:ident[$i:expr]) => {
        // SAFETY: as above; the index is a constant within the array.
        unsafe { core::ptr::read_volatile(&crate::kernel::offsets().$field[$i]) }
    };
}
pub(crate) use off;

/// One syscall number of this architecture.
macro_rules! nr {
    ($name:ident) => {
        // SAFETY: a volatile read of a field of a static: valid and aligned.
        unsafe { core::ptr::read_volatile(&crate::kernel::syscall_nrs().$name) }
    };
}
pub(crate) use nr;

#[inline(always)]
pub fn offsets() -> &'static KernelOffsets {
    &OFFSETS
}

#[inline(always)]
pub fn syscall_nrs() -> &'static SyscallNrs {
    &NRS
}

/// shmtrace's own tgid (never traced).
#[inline(always)]
pub fn self_tgid() -> u32 {
    // SAFETY: a volatile read of a field of a static: valid and aligned.
    unsafe { core::ptr::read_volatile(&CONFIG.self_tgid) }
}

#[inline(always)]
pub fn all_processes() -> bool {
    // SAFETY: a volatile read of a field of a static: valid and aligned.
    unsafe { core::ptr::read_volatile(&CONFIG.all_processes) != 0 }
}

/// Reads a `T` at `base + off`; `None` when the offset is unknown or the read faults.
#[inline(always)]
pub fn read<T>(base: u64, off: u32) -> Option<T> {
    if base == 0 || off == M {
        return None;
    }
    // SAFETY: the checked helper: a bad address returns an error, never a fault.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T) }.ok()
}

#[inline(always)]
pub fn read_ptr(base: u64, off: u32) -> u64 {
    read::<u64>(base, off).unwrap_or(0)
}

#[inline(always)]
pub fn current_task() -> u64 {
    // SAFETY: a helper without arguments; the result is only used as an
    // address for checked reads.
    unsafe { bpf_get_current_task() }
}

#[inline(always)]
pub fn task_tgid(task: u64) -> u32 {
    read::<u32>(task, off!(task_tgid)).unwrap_or(0)
}

#[inline(always)]
pub fn task_pid(task: u64) -> u32 {
    read::<u32>(task, off!(task_pid)).unwrap_or(0)
}

#[inline(always)]
pub fn task_ppid(task: u64) -> u32 {
    task_tgid(read_ptr(task, off!(task_real_parent)))
}

#[inline(always)]
pub fn task_mnt_ns(task: u64) -> u32 {
    let ns = read_ptr(read_ptr(task, off!(task_nsproxy)), off!(nsproxy_mnt_ns));
    read::<u32>(ns, off!(mnt_ns_inum)).unwrap_or(0)
}

/// The process's tgid as its own PID namespace numbers it:
/// group_leader->thread_pid->numbers[level].nr (0 when unknown).
#[inline(always)]
pub fn task_ns_tgid(task: u64) -> u32 {
    let leader = read_ptr(task, off!(task_group_leader));
    let pid = read_ptr(leader, off!(task_thread_pid));
    let Some(level) = read::<u32>(pid, off!(pid_level)) else {
        return 0;
    };
    let (numbers, size) = (off!(pid_numbers), off!(upid_size));
    // PID namespaces nest at most 32 deep (MAX_PID_NS_LEVEL).
    if level > 32 || numbers == M || size == M {
        return 0;
    }
    read::<u32>(pid, numbers + level * size).unwrap_or(0)
}

/// The id of `task`'s memory cgroup: task->cgroups->subsys[memory]->
/// cgroup->kn->id, the kernfs inode number of its directory in the
/// hierarchy the memory controller is on (0 when unknown). On v2 that is
/// the nearest cgroup at or above the task's with memory enabled: where its
/// pages are charged.
#[inline(always)]
pub fn task_memcg_id(task: u64) -> u64 {
    let cset = read_ptr(task, off!(task_cgroups));
    let css = read_ptr(cset, off!(css_set_memcg));
    let cgroup = read_ptr(css, off!(css_cgroup));
    let kn = read_ptr(cgroup, off!(cgroup_kn));
    read::<u64>(kn, off!(kn_id)).unwrap_or(0)
}

/// The `struct file` behind `fd` in the current task, or 0.
#[inline(always)]
pub fn fd_file(fd: u64) -> u64 {
    let files = read_ptr(current_task(), off!(task_files));
    let fdt = read_ptr(files, off!(files_fdt));
    let max = read::<u32>(fdt, off!(fdt_max_fds)).unwrap_or(0) as u64;
    if fd >= max {
        return 0;
    }
    let fds = read_ptr(fdt, off!(fdt_fd));
    if fds == 0 {
        return 0;
    }
    // SAFETY: the checked helper; fd < max_fds keeps it inside the array.
    unsafe { bpf_probe_read_kernel((fds + fd * 8) as *const u64) }.unwrap_or(0)
}

/// The inode of `file` when it lives on tmpfs/shmem, or 0.
#[inline(always)]
pub fn tmpfs_inode(file: u64) -> u64 {
    let inode = read_ptr(file, off!(file_inode));
    let sb = read_ptr(inode, off!(inode_sb));
    match read::<u64>(sb, off!(sb_magic)) {
        Some(TMPFS_MAGIC) => inode,
        _ => 0,
    }
}

/// Fills the mount part of `info` (device, size, use) from superblock `sb`.
#[inline(always)]
pub fn fill_fs_info(info: &mut FileInfo, sb: u64) {
    info.dev = sb_dev(sb);
    let sbinfo = read_ptr(sb, off!(sb_fs_info));
    info.fs_max_pages = read::<u64>(sbinfo, off!(sbinfo_max_blocks)).unwrap_or(0);
    info.fs_used_pages = read::<i64>(sbinfo, off!(sbinfo_used_blocks)).unwrap_or(0);
}

/// The current process's limits and use (failure records only: a few
/// reads, on a path that is already rare).
#[inline(always)]
pub fn fill_limits(l: &mut shmtrace_common::ProcLimits) {
    const RLIMIT_FSIZE: u32 = 1;
    const RLIMIT_NOFILE: u32 = 7;
    const RLIMIT_AS: u32 = 9;
    // struct rlimit { rlim_cur, rlim_max }: 16 bytes.
    let task = current_task();
    let rlim = read_ptr(task, off!(task_signal));
    let base = off!(signal_rlim);
    if rlim != 0 && base != M {
        let cur = |r: u32| read::<u64>(rlim, base + r * 16).unwrap_or(u64::MAX);
        l.rlim_as = cur(RLIMIT_AS);
        l.rlim_fsize = cur(RLIMIT_FSIZE);
        l.rlim_nofile = cur(RLIMIT_NOFILE);
        l.valid = 1;
    }
    let mm = read_ptr(task, off!(task_mm));
    l.total_vm_pages = read::<u64>(mm, off!(mm_total_vm)).unwrap_or(0);
    l.map_count = read::<i32>(mm, off!(mm_map_count)).unwrap_or(0) as u32;
}

/// The mount flags of `file` (MNT_NOEXEC...), 0 when unknown.
#[inline(always)]
pub fn file_mnt_flags(file: u64) -> u32 {
    read::<u32>(read_ptr(file, off!(file_mnt)), off!(vfsmount_flags)).unwrap_or(0)
}

/// The mount point of `file`'s mount, as names from the leaf up (see
/// `shmtrace_common::MOUNTPOINT_NAMES`); left empty when it is deeper.
#[inline(always)]
pub fn fill_mountpoint(out: &mut [u8; shmtrace_common::PATH_LEN], file: u64) {
    use shmtrace_common::{MOUNTPOINT_NAME_LEN as LEN, MOUNTPOINT_NAMES as N};
    let vfsmnt = read_ptr(file, off!(file_mnt));
    let (m_mnt, m_parent, m_point) = (off!(mount_mnt), off!(mount_parent), off!(mount_mountpoint));
    if vfsmnt == 0 || m_mnt == M || m_parent == M || m_point == M {
        return;
    }
    // SAFETY: [u8; N * LEN] and [[u8; LEN]; N] have the same size and
    // alignment; the borrow of `out` keeps it exclusive.
    let slots =
        unsafe { &mut *(out as *mut [u8; shmtrace_common::PATH_LEN]).cast::<[[u8; LEN]; N]>() };
    let mut mnt = vfsmnt - m_mnt as u64;
    let mut slot = 0usize;
    // Up to 8 mounts up (stacked mounts count), each up to 4 dentries to
    // its parent mount's root.
    for _ in 0..8 {
        let parent = read_ptr(mnt, m_parent);
        if parent == 0 || parent == mnt {
            return; // the namespace's root: done
        }
        let root = read_ptr(parent + m_mnt as u64, off!(vfsmount_root));
        let mut d = read_ptr(mnt, m_point);
        for _ in 0..4 {
            if d == 0 || d == root {
                break;
            }
            if slot >= N {
                slots[0][0] = 0; // deeper than we keep: unknown
                return;
            }
            read_name(d, &mut slots[slot]);
            slot += 1;
            d = read_ptr(d, off!(dentry_parent));
        }
        mnt = parent;
    }
    slots[0][0] = 0;
}

/// The kernel dev of superblock `sb` (0 when unknown).
#[inline(always)]
pub fn sb_dev(sb: u64) -> u32 {
    read::<u32>(sb, off!(sb_dev)).unwrap_or(0)
}

/// Fills `info` from a tmpfs `file` and its `inode`.
#[inline(always)]
pub fn fill_file_info(info: &mut FileInfo, file: u64, inode: u64) {
    fill_dentry_info(info, read_ptr(file, off!(file_dentry)), inode);
}

/// Whether `inode` (of a directory or a file) is on tmpfs/shmem.
#[inline(always)]
pub fn is_tmpfs_inode(inode: u64) -> bool {
    let sb = read_ptr(inode, off!(inode_sb));
    read::<u64>(sb, off!(sb_magic)) == Some(TMPFS_MAGIC)
}

/// Whether a mapping of `len` bytes more would take the current process
/// past its RLIMIT_AS: the test mmap_region makes (may_expand_vm) after
/// the address is chosen, made here where only the address is known.
#[inline(always)]
pub fn exceeds_address_space(len: u64) -> bool {
    const RLIMIT_AS: u32 = 9;
    const PAGE_SHIFT: u64 = 12;
    let task = current_task();
    let base = off!(signal_rlim);
    if base == M {
        return false;
    }
    let cur =
        read::<u64>(read_ptr(task, off!(task_signal)), base + RLIMIT_AS * 16).unwrap_or(u64::MAX);
    if cur == u64::MAX {
        return false; // RLIM_INFINITY
    }
    let Some(total) = read::<u64>(read_ptr(task, off!(task_mm)), off!(mm_total_vm)) else {
        return false;
    };
    total + (len >> PAGE_SHIFT) > cur >> PAGE_SHIFT
}

/// Fills `info` from a tmpfs `dentry` and its `inode`.
#[inline(always)]
pub fn fill_dentry_info(info: &mut FileInfo, dentry: u64, inode: u64) {
    let sb = read_ptr(inode, off!(inode_sb));
    info.valid = 1;
    fill_fs_info(info, sb);
    info.ino = read::<u64>(inode, off!(inode_ino)).unwrap_or(0);
    info.size = read::<i64>(inode, off!(inode_size)).unwrap_or(0);
    info.blocks = read::<u64>(inode, off!(inode_blocks)).unwrap_or(0);
    info.nlink = read::<u32>(inode, off!(inode_nlink)).unwrap_or(0);

    let parent = read_ptr(dentry, off!(dentry_parent));
    read_name(dentry, &mut info.name);
    if parent == 0 || parent == dentry {
        return;
    }
    read_name(parent, &mut info.parent);
    let grand = read_ptr(parent, off!(dentry_parent));
    info.depth = if grand == parent {
        1
    } else if read_ptr(grand, off!(dentry_parent)) == grand {
        2
    } else {
        0
    };
}

#[inline(always)]
fn read_name(dentry: u64, out: &mut [u8]) {
    let name = read_ptr(dentry, off!(dentry_name));
    if name != 0 {
        // SAFETY: the checked helper, bounded by the destination's length.
        let _ = unsafe { bpf_probe_read_kernel_str_bytes(name as *const u8, out) };
    }
}
