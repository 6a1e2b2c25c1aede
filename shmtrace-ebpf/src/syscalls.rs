//! Syscall exits: failures of writes (write, pwrite, writev, pwritev2,
//! sendfile, splice, copy_file_range), fallocate, ftruncate, mmap, mremap
//! and opens on tmpfs, and the ordinary calls that attribution needs (tmpfs
//! opens with O_CREAT, mmap and mremap of processes that map tmpfs,
//! ftruncate, recvmsg with control data). close, dup, fcntl and munmap are
//! not hooked: every process on the node would pay for them, and user
//! space's check of each tracked fd and mapping once a second sees what
//! they did.

use aya_ebpf::{
    helpers::{bpf_probe_read_user, bpf_probe_read_user_str_bytes},
    macros::tracepoint,
    programs::TracePointContext,
};
use shmtrace_common::{EDQUOT, EFBIG, EMFILE, ENFILE, ENOENT, ENOMEM, ENOSPC, EventKind};

use crate::{
    emit::{self, Ring, SHM_MAPPED},
    kernel::{self, nr, off},
    sysexit::{BtfRegs, Regs, StackRegs, exit_record, is_shm_path, tgid},
};

const MAP_ANONYMOUS: u64 = 0x20;
pub(crate) const O_CREAT: u64 = 0o100;

// Classic per-syscall exit tracepoints, attached (by the loader) to the
// syscalls that matter only: read, futex, epoll and the rest never run a
// program. The first test is on the return value, read from the
// tracepoint's own record; arguments come from the task's saved user
// registers and are read only past that test. Everything that can report a
// failure is one program, so its failure path is verified once (each copy
// costs the verifier about half a second).

/// Writes and allocations (write, pwrite64, writev, pwritev, pwritev2,
/// fallocate, sendfile64, splice, copy_file_range: only failures matter),
/// opens (open, openat, openat2, creat: failures, and tmpfs files
/// created), mmap (every error, and tmpfs mappings), mremap (of
/// processes that map tmpfs, and every error), ftruncate (sizes of tmpfs
/// files).
#[tracepoint]
pub fn sys_exit_files(ctx: TracePointContext) -> u32 {
    files::<BtfRegs>(&ctx)
}

// `sys_exit_files` for kernels before 5.15 (see `StackRegs`), one program
// per family of syscalls (see `fam`).

/// write, pwrite64, writev, pwritev, pwritev2, fallocate, sendfile64,
/// splice, copy_file_range: failures.
#[tracepoint]
pub fn sys_exit_writes_stack(ctx: TracePointContext) -> u32 {
    let (nr, ret) = exit_record(&ctx);
    if ret < 0
        && let Some(regs) = StackRegs::current(nr)
    {
        on_failure::<StackRegs, { fam::WRITES }>(regs, nr, ret);
    }
    0
}

/// open, openat, openat2, creat: failures and tmpfs files created.
#[tracepoint]
pub fn sys_exit_opens_stack(ctx: TracePointContext) -> u32 {
    let (nr, ret) = exit_record(&ctx);
    if let Some(regs) = StackRegs::current(nr) {
        if ret < 0 {
            on_failure::<StackRegs, { fam::OPENS }>(regs, nr, ret);
        } else {
            on_open(regs, nr, ret);
        }
    }
    0
}

/// mmap: every error, and tmpfs mappings.
#[tracepoint]
pub fn sys_exit_mmap_stack(ctx: TracePointContext) -> u32 {
    let (nr, ret) = exit_record(&ctx);
    if let Some(regs) = StackRegs::current(nr) {
        if ret < 0 {
            on_failure::<StackRegs, { fam::MMAP }>(regs, nr, ret);
        } else {
            on_mmap(regs, ret);
        }
    }
    0
}

/// mremap: every error, and moves of processes that map tmpfs.
#[tracepoint]
pub fn sys_exit_mremap_stack(ctx: TracePointContext) -> u32 {
    let (nr, ret) = exit_record(&ctx);
    if let Some(regs) = StackRegs::current(nr) {
        if ret < 0 {
            on_failure::<StackRegs, { fam::MREMAP }>(regs, nr, ret);
        } else {
            on_remap(regs, ret);
        }
    }
    0
}

/// ftruncate: failures and sizes of tmpfs files.
#[tracepoint]
pub fn sys_exit_ftruncate_stack(ctx: TracePointContext) -> u32 {
    let (nr, ret) = exit_record(&ctx);
    if let Some(regs) = StackRegs::current(nr) {
        if ret < 0 {
            on_failure::<StackRegs, { fam::FTRUNCATE }>(regs, nr, ret);
        } else {
            on_truncate(regs);
        }
    }
    0
}

#[inline(always)]
fn files<R: Regs>(ctx: &TracePointContext) -> u32 {
    let (nr, ret) = exit_record(ctx);
    // Registers are found only past the tests on the record.
    let is_open = nr == nr!(openat) || nr == nr!(open) || nr == nr!(openat2) || nr == nr!(creat);
    if ret >= 0 && !is_open && nr != nr!(mmap) && nr != nr!(mremap) && nr != nr!(ftruncate) {
        return 0;
    }
    let Some(regs) = R::current(nr) else {
        return 0;
    };
    if ret < 0 {
        on_failure::<R, { fam::ANY }>(regs, nr, ret);
    } else if is_open {
        on_open(regs, nr, ret);
    } else if nr == nr!(mmap) {
        on_mmap(regs, ret);
    } else if nr == nr!(mremap) {
        on_remap(regs, ret);
    } else {
        on_truncate(regs);
    }
    0
}

/// recvmsg: fds received over unix sockets.
#[tracepoint]
pub fn sys_exit_recv(ctx: TracePointContext) -> u32 {
    recv::<BtfRegs>(&ctx)
}

/// `sys_exit_recv` for kernels before 5.15.
#[tracepoint]
pub fn sys_exit_recv_stack(ctx: TracePointContext) -> u32 {
    recv::<StackRegs>(&ctx)
}

#[inline(always)]
fn recv<R: Regs>(ctx: &TracePointContext) -> u32 {
    let (nr, ret) = exit_record(ctx);
    if ret >= 0
        && let Some(regs) = R::current(nr)
    {
        on_recvmsg(regs);
    }
    0
}

/// fds that arrive over a unix socket (how PyTorch passes its segments):
/// only a recvmsg that returned control data (msg_controllen > 0 after the
/// call) can carry SCM_RIGHTS, so only those are reported.
#[inline(always)]
pub(crate) fn on_recvmsg<R: Regs>(regs: R) {
    let tgid = tgid();
    if !emit::is_traced(tgid) {
        return;
    }
    // struct user_msghdr: msg_controllen (a size_t) at byte 40 on 64-bit.
    let msg = regs.arg(1);
    // SAFETY: a user pointer read with the checked helper; a bad pointer
    // returns an error, never a fault.
    let controllen = unsafe { bpf_probe_read_user((msg + 40) as *const u64) }.unwrap_or(0);
    if controllen == 0 {
        return;
    }
    if let Some(mut e) = emit::start(Ring::Events, EventKind::RecvFds) {
        let ev = emit::body(&mut e);
        ev.syscall = nr!(recvmsg);
        ev.args[0] = controllen;
        emit::submit_tmpfs(e);
    }
}

/// Who holds tmpfs files by fd: creations of tmpfs files.
#[inline(always)]
pub(crate) fn on_open<R: Regs>(regs: R, nr: u32, fd: i64) {
    // Only creations: files opened without O_CREAT (a consumer opening a
    // named segment) show up when mapped, and the fd rescan finds them.
    if open_flags(regs, nr) & O_CREAT == 0 {
        return;
    }
    let tgid = tgid();
    if !emit::is_traced(tgid) {
        return;
    }
    let file = kernel::fd_file(fd as u64);
    let inode = kernel::tmpfs_inode(file);
    if inode == 0 {
        return;
    }
    let Some(mut e) = emit::start(Ring::Events, EventKind::Open) else {
        return;
    };
    let ev = emit::body(&mut e);
    ev.syscall = nr;
    ev.ret = fd;
    for i in 0..4 {
        ev.args[i] = regs.arg(i);
    }
    kernel::fill_file_info(&mut ev.file, file, inode);
    emit::submit_tmpfs(e);
}

/// A tmpfs file created at `dentry` (the trampoline backend's create
/// hook), before the open that created it has an fd: reported with fd -1,
/// and user space lists the creator's fds on its next tick.
#[inline(always)]
pub(crate) fn on_created<R: Regs>(regs: R, nr: u32, dentry: u64) {
    let tgid = tgid();
    if !emit::is_traced(tgid) {
        return;
    }
    let inode = kernel::read_ptr(dentry, off!(dentry_inode));
    if inode == 0 || !kernel::is_tmpfs_inode(inode) {
        return;
    }
    let Some(mut e) = emit::start(Ring::Events, EventKind::Open) else {
        return;
    };
    let ev = emit::body(&mut e);
    ev.syscall = nr;
    ev.ret = -1;
    for i in 0..4 {
        ev.args[i] = regs.arg(i);
    }
    kernel::fill_dentry_info(&mut ev.file, dentry, inode);
    emit::submit_tmpfs(e);
}

/// The open flags of open syscall `nr` (O_CREAT for creat).
#[inline(always)]
pub(crate) fn open_flags<R: Regs>(regs: R, nr: u32) -> u64 {
    if nr == nr!(openat) {
        regs.arg(2)
    } else if nr == nr!(open) {
        regs.arg(1)
    } else if nr == nr!(creat) {
        O_CREAT
    } else {
        // openat2(dirfd, path, struct open_how *how, size): how->flags first.
        // SAFETY: a user pointer read with the checked helper.
        unsafe { bpf_probe_read_user(regs.arg(2) as *const u64) }.unwrap_or(0)
    }
}

/// Which syscalls a program is attached to. `ANY` tells them apart at run
/// time; the stack variants attach one program per family, so that the
/// verifier of kernels before 5.15 (which gives up at a million
/// instructions) follows fewer paths through each.
pub(crate) mod fam {
    pub const ANY: u8 = 0;
    pub const WRITES: u8 = 1;
    pub const OPENS: u8 = 2;
    pub const MMAP: u8 = 3;
    pub const MREMAP: u8 = 4;
    pub const FTRUNCATE: u8 = 5;
}

#[inline(always)]
pub(crate) fn on_failure<R: Regs, const F: u8>(regs: R, nr: u32, ret: i64) {
    let errno = -ret;
    let is_mmap = if F == fam::ANY {
        nr == nr!(mmap)
    } else {
        F == fam::MMAP
    };
    let is_mremap = if F == fam::ANY {
        nr == nr!(mremap)
    } else {
        F == fam::MREMAP
    };
    let is_map = is_mmap || is_mremap;
    // Errors that mean a limit was hit (space, quota, file size, memory,
    // fds); mmap and mremap report every error: their cause is the point.
    // ENOENT: a segment gone before it was opened (tested on the path below).
    if !is_map
        && errno != ENOENT
        && errno != ENOSPC
        && errno != EDQUOT
        && errno != EFBIG
        && errno != ENOMEM
        && errno != EMFILE
        && errno != ENFILE
    {
        return;
    }
    let by_fd = if F == fam::ANY {
        nr == nr!(write)
            || nr == nr!(pwrite64)
            || nr == nr!(writev)
            || nr == nr!(pwritev)
            || nr == nr!(pwritev2)
            || nr == nr!(fallocate)
            || nr == nr!(ftruncate)
            || nr == nr!(mmap)
            || nr == nr!(sendfile)
            || nr == nr!(splice)
            || nr == nr!(copy_file_range)
    } else {
        F == fam::WRITES || F == fam::FTRUNCATE || F == fam::MMAP
    };
    let by_path = if F == fam::ANY {
        nr == nr!(open) || nr == nr!(openat) || nr == nr!(openat2) || nr == nr!(creat)
    } else {
        F == fam::OPENS
    };
    if !(by_fd || by_path || is_mremap) {
        return;
    }
    // Stamped before the first map look-up (see `emit::now`).
    let ts = emit::now();
    if !emit::is_traced(tgid()) {
        return;
    }
    // Opens that find no file are everyday (library and config searches):
    // only those of /dev/shm/ names are reported.
    if errno == ENOENT {
        let p = if nr == nr!(open) || nr == nr!(creat) {
            regs.arg(0)
        } else {
            regs.arg(1)
        };
        if !by_path || !is_shm_path(p) {
            return;
        }
    }
    // Only failures on tmpfs files are shm failures: test the fd's filesystem
    // here. Paths (open*) and mremap ranges are classified in user space.
    let (file, inode) = if by_fd {
        let fd = if is_mmap {
            regs.arg(4)
        } else if F != fam::WRITES && F != fam::ANY {
            regs.arg(0)
        } else if nr == nr!(splice) || nr == nr!(copy_file_range) {
            // (fd_in, off_in, fd_out, ...): the tmpfs side is the output.
            regs.arg(2)
        } else {
            regs.arg(0)
        };
        let file = kernel::fd_file(fd);
        let inode = kernel::tmpfs_inode(file);
        if inode == 0 {
            return;
        }
        (file, inode)
    } else {
        (0, 0)
    };
    let dev = if inode != 0 {
        kernel::sb_dev(kernel::read_ptr(inode, off!(inode_sb)))
    } else {
        0
    };
    let Some(mut e) = emit::start_failure(EventKind::SyscallFail, tgid(), dev, ts) else {
        return;
    };
    let ev = emit::body(&mut e);
    ev.syscall = nr;
    ev.ret = ret;
    for i in 0..6 {
        ev.args[i] = regs.arg(i);
    }
    // Which limit it ran into, read now: the process may not live long.
    if errno == ENOMEM || errno == EFBIG || errno == EMFILE {
        kernel::fill_limits(&mut ev.limits);
    }
    if inode != 0 {
        kernel::fill_file_info(&mut ev.file, file, inode);
        ev.limits.mnt_flags = kernel::file_mnt_flags(file);
        kernel::fill_mountpoint(&mut ev.path, file);
        if (F == fam::WRITES || F == fam::ANY) && (nr == nr!(write) || nr == nr!(writev)) {
            // No offset argument: where the file position stood.
            ev.args[3] = kernel::read::<i64>(file, off!(file_pos)).unwrap_or(0) as u64;
        }
    }
    if by_path {
        let p = if nr == nr!(open) || nr == nr!(creat) {
            ev.args[0]
        } else {
            ev.args[1]
        };
        // SAFETY: a user pointer read with the checked helper, bounded by
        // the destination's length.
        let _ = unsafe { bpf_probe_read_user_str_bytes(p as *const u8, &mut ev.path) };
    }
    emit::submit_now(e);
}

#[inline(always)]
pub(crate) fn on_mmap<R: Regs>(regs: R, addr: i64) {
    let flags = regs.arg(3);
    if flags & MAP_ANONYMOUS != 0 {
        return;
    }
    on_mmap_file(regs, kernel::fd_file(regs.arg(4)), addr);
}

/// A mapping of `file` at `addr` (made, or about to be: see the trampoline
/// backend's `mmap`): tmpfs files only.
#[inline(always)]
pub(crate) fn on_mmap_file<R: Regs>(regs: R, file: u64, addr: i64) {
    let tgid = tgid();
    if !emit::is_traced(tgid) {
        return;
    }
    let inode = kernel::tmpfs_inode(file);
    if inode == 0 {
        return;
    }
    let _ = SHM_MAPPED.insert(tgid, kernel::read_ptr(inode, off!(inode_sb)), 0);
    let Some(mut e) = emit::start(Ring::Events, EventKind::Map) else {
        return;
    };
    let ev = emit::body(&mut e);
    ev.syscall = nr!(mmap);
    ev.ret = addr;
    for i in 0..6 {
        ev.args[i] = regs.arg(i);
    }
    kernel::fill_file_info(&mut ev.file, file, inode);
    // Where it is mounted, for a namespace gone before user space reads it.
    kernel::fill_mountpoint(&mut ev.path, file);
    emit::submit_tmpfs(e);
}

/// Sizes of mapped tmpfs files: tells a fault past the end of a file (not
/// an allocation failure) from a full tmpfs.
#[inline(always)]
pub(crate) fn on_truncate<R: Regs>(regs: R) {
    if !emit::is_traced(tgid()) {
        return;
    }
    let file = kernel::fd_file(regs.arg(0));
    let inode = kernel::tmpfs_inode(file);
    if inode == 0 {
        return;
    }
    let Some(mut e) = emit::start(Ring::Events, EventKind::Truncate) else {
        return;
    };
    let ev = emit::body(&mut e);
    ev.syscall = nr!(ftruncate);
    ev.args[0] = regs.arg(0);
    ev.args[1] = regs.arg(1);
    kernel::fill_file_info(&mut ev.file, file, inode);
    emit::submit_tmpfs(e);
}

#[inline(always)]
pub(crate) fn on_remap<R: Regs>(regs: R, ret: i64) {
    let tgid = tgid();
    // Only processes that ever mapped tmpfs: Python frees arenas all the time.
    // SAFETY: only presence is tested; no reference is kept.
    if unsafe { SHM_MAPPED.get(tgid) }.is_none() || !emit::is_traced(tgid) {
        return;
    }
    let Some(mut e) = emit::start(Ring::Events, EventKind::Remap) else {
        return;
    };
    let ev = emit::body(&mut e);
    ev.syscall = nr!(mremap);
    ev.ret = ret;
    ev.args[0] = regs.arg(0);
    ev.args[1] = regs.arg(1);
    ev.args[2] = regs.arg(2);
    emit::submit_tmpfs(e);
}
