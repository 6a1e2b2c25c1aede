//! The trampoline backend: fexit programs on the kernel functions that do
//! tmpfs's work, each the same handler as a syscall exit program (see
//! `syscalls`, `unlink`), with the syscall's number and arguments read from
//! the task's saved registers. A syscall tracepoint puts every syscall of
//! every process on the kernel's slow path; a trampoline runs only when its
//! function does: tmpfs's own (shmem_fallocate, shmem_unlink, the write
//! path's write_iter, its create, lookup and mmap placement) cost nothing
//! to a process that never touches tmpfs; ftruncate and mremap, which few
//! processes call, pay a direct call and a test. The loader picks, per need, these
//! or the tracepoint programs (capture/hooks.rs). An fexit program reads
//! the function's return value as the argument after its last one, so each
//! is written for its function's parameter count, which the loader checks
//! against BTF before it loads one.

use aya_ebpf::{macros::fexit, programs::FExitContext};

use shmtrace_common::{ENOENT, ENOMEM, EPERM};

use crate::{
    kernel::nr,
    syscalls::{self, O_CREAT, fam},
    sysexit::{BtfRegs, Regs, StackRegs},
    unlink,
};

/// The return value of a function of `N` parameters.
#[inline(always)]
fn ret<const N: usize>(ctx: &FExitContext) -> i64 {
    ctx.arg::<i64>(N)
}

/// write_iter of tmpfs (generic_file_write_iter before 6.12,
/// shmem_file_write_iter since; 2 parameters): failed writes, pwrites,
/// writevs, sendfile, splice and copy_file_range into tmpfs.
#[inline(always)]
fn writes<R: Regs>(ctx: &FExitContext) -> u32 {
    let ret = ret::<2>(ctx);
    if ret < 0
        && let Some((regs, nr)) = R::current_any()
    {
        syscalls::on_failure::<R, { fam::WRITES }>(regs, nr, ret);
    }
    0
}

#[fexit]
pub fn fx_writes(ctx: FExitContext) -> u32 {
    writes::<BtfRegs>(&ctx)
}

#[fexit]
pub fn fx_writes_stack(ctx: FExitContext) -> u32 {
    writes::<StackRegs>(&ctx)
}

/// shmem_fallocate(file, mode, offset, len): failed fallocates.
#[inline(always)]
fn fallocate<R: Regs>(ctx: &FExitContext) -> u32 {
    let ret = ret::<4>(ctx);
    if ret < 0
        && let Some((regs, nr)) = R::current_any()
    {
        syscalls::on_failure::<R, { fam::WRITES }>(regs, nr, ret);
    }
    0
}

#[fexit]
pub fn fx_fallocate(ctx: FExitContext) -> u32 {
    fallocate::<BtfRegs>(&ctx)
}

#[fexit]
pub fn fx_fallocate_stack(ctx: FExitContext) -> u32 {
    fallocate::<StackRegs>(&ctx)
}

/// shmem_create(idmap, dir, dentry, mode, excl) (5.12+; 4 parameters
/// before, without the idmap): an open with O_CREAT that makes a tmpfs
/// file, and its ENOSPC at the mount's inode limit. Runs only when tmpfs
/// creates a file; the open's fd does not exist yet (see `on_created`).
#[inline(always)]
fn create<R: Regs, const N: usize>(ctx: &FExitContext) -> u32 {
    // An int: the upper half of the saved return register is not its sign.
    let ret = ret::<N>(ctx) as i32 as i64;
    let Some((regs, nr)) = R::current_any() else {
        return 0;
    };
    if !is_open(nr) {
        return 0; // a kernel user (devtmpfs, a filesystem's helper)
    }
    if ret < 0 {
        syscalls::on_failure::<R, { fam::OPENS }>(regs, nr, ret);
    } else {
        syscalls::on_created(regs, nr, ctx.arg::<u64>(N - 3));
    }
    0
}

#[inline(always)]
fn is_open(nr: u32) -> bool {
    nr == nr!(openat) || nr == nr!(open) || nr == nr!(openat2) || nr == nr!(creat)
}

#[fexit]
pub fn fx_create(ctx: FExitContext) -> u32 {
    create::<BtfRegs, 5>(&ctx)
}

#[fexit]
pub fn fx_create_stack(ctx: FExitContext) -> u32 {
    create::<StackRegs, 4>(&ctx)
}

#[fexit]
pub fn fx_create_stack5(ctx: FExitContext) -> u32 {
    create::<StackRegs, 5>(&ctx)
}

/// simple_lookup(dir, dentry, flags), tmpfs's lookup (shared with ramfs
/// and a few pseudo filesystems): called only for a name the dcache does
/// not have, which on tmpfs means a name that does not exist (tmpfs keeps
/// every file's dentry). An open without O_CREAT that gets here fails with
/// ENOENT: the segment a consumer looks for is gone.
#[inline(always)]
fn lookup<R: Regs>(ctx: &FExitContext) -> u32 {
    if !crate::kernel::is_tmpfs_inode(ctx.arg::<u64>(0)) {
        return 0;
    }
    let Some((regs, nr)) = R::current_any() else {
        return 0;
    };
    if !is_open(nr) || syscalls::open_flags(regs, nr) & O_CREAT != 0 {
        return 0;
    }
    syscalls::on_failure::<R, { fam::OPENS }>(regs, nr, -ENOENT);
    0
}

#[fexit]
pub fn fx_lookup(ctx: FExitContext) -> u32 {
    lookup::<BtfRegs>(&ctx)
}

#[fexit]
pub fn fx_lookup_stack(ctx: FExitContext) -> u32 {
    lookup::<StackRegs>(&ctx)
}

/// shmem_get_unmapped_area(file, addr, len, pgoff, flags): where an mmap of
/// a tmpfs file (or a MAP_SHARED anonymous one, file NULL) goes, chosen
/// before the mapping is made; anonymous private mmaps never call it. Its
/// own errors are the mmap's; the two limits do_mmap and mmap_region test
/// after it (RLIMIT_AS, PROT_EXEC on a noexec mount) are tested here the
/// same way, and a mapping that passes them is reported at the address
/// chosen (user space checks each tracked mapping against /proc, so one
/// that failed later still goes).
#[inline(always)]
fn mmap<R: Regs>(ctx: &FExitContext) -> u32 {
    const MAP_FIXED: u64 = 0x10;
    const PROT_EXEC: u64 = 4;
    const MNT_NOEXEC: u32 = 4;
    let file = ctx.arg::<u64>(0);
    if file == 0 {
        return 0;
    }
    let Some((regs, nr)) = R::current_any() else {
        return 0;
    };
    if nr != nr!(mmap) {
        return 0; // shmat, mremap: not mmap(2)
    }
    let ret = ret::<5>(ctx);
    let (len, flags) = (ctx.arg::<u64>(2), ctx.arg::<u64>(4));
    if (-4095..0).contains(&ret) {
        syscalls::on_failure::<R, { fam::MMAP }>(regs, nr, ret);
    } else if flags & MAP_FIXED == 0 && crate::kernel::exceeds_address_space(len) {
        // (A MAP_FIXED mapping replaces what it overlaps: not predicted.)
        syscalls::on_failure::<R, { fam::MMAP }>(regs, nr, -ENOMEM);
    } else if regs.arg(2) & PROT_EXEC != 0 && crate::kernel::file_mnt_flags(file) & MNT_NOEXEC != 0
    {
        syscalls::on_failure::<R, { fam::MMAP }>(regs, nr, -EPERM);
    } else {
        syscalls::on_mmap_file(regs, file, ret);
    }
    0
}

#[fexit]
pub fn fx_mmap(ctx: FExitContext) -> u32 {
    mmap::<BtfRegs>(&ctx)
}

#[fexit]
pub fn fx_mmap_stack(ctx: FExitContext) -> u32 {
    mmap::<StackRegs>(&ctx)
}

/// __x64_sys_mremap(regs): mremap(2) only.
#[inline(always)]
fn mremap<R: Regs>(ctx: &FExitContext) -> u32 {
    let ret = ret::<1>(ctx);
    let Some((regs, nr)) = R::current_any() else {
        return 0;
    };
    if ret < 0 {
        syscalls::on_failure::<R, { fam::MREMAP }>(regs, nr, ret);
    } else {
        syscalls::on_remap(regs, ret);
    }
    0
}

#[fexit]
pub fn fx_mremap(ctx: FExitContext) -> u32 {
    mremap::<BtfRegs>(&ctx)
}

#[fexit]
pub fn fx_mremap_stack(ctx: FExitContext) -> u32 {
    mremap::<StackRegs>(&ctx)
}

/// do_sys_ftruncate(fd, length, small): ftruncate(2) and truncate's fd
/// form; failures and sizes of tmpfs files.
#[inline(always)]
fn ftruncate<R: Regs>(ctx: &FExitContext) -> u32 {
    let ret = ret::<3>(ctx);
    let Some((regs, nr)) = R::current_any() else {
        return 0;
    };
    if nr != nr!(ftruncate) {
        return 0;
    }
    if ret < 0 {
        syscalls::on_failure::<R, { fam::FTRUNCATE }>(regs, nr, ret);
    } else {
        syscalls::on_truncate(regs);
    }
    0
}

#[fexit]
pub fn fx_ftruncate(ctx: FExitContext) -> u32 {
    ftruncate::<BtfRegs>(&ctx)
}

#[fexit]
pub fn fx_ftruncate_stack(ctx: FExitContext) -> u32 {
    ftruncate::<StackRegs>(&ctx)
}

/// scm_detach_fds(msg, scm): runs only when a received message carries
/// SCM_RIGHTS fds (how PyTorch passes its segments).
#[inline(always)]
fn recv<R: Regs>() -> u32 {
    if let Some((regs, _)) = R::current_any() {
        syscalls::on_recvmsg(regs);
    }
    0
}

#[fexit]
pub fn fx_recv(_ctx: FExitContext) -> u32 {
    recv::<BtfRegs>()
}

#[fexit]
pub fn fx_recv_stack(_ctx: FExitContext) -> u32 {
    recv::<StackRegs>()
}

/// shmem_unlink(dir, dentry): removals on tmpfs only.
#[inline(always)]
fn unlinks<R: Regs>(ctx: &FExitContext) -> u32 {
    if ret::<2>(ctx) as i32 != 0 {
        return 0;
    }
    if let Some((regs, nr)) = R::current_any()
        && (nr == nr!(unlink) || nr == nr!(unlinkat))
    {
        unlink::on_unlink(regs, nr);
    }
    0
}

#[fexit]
pub fn fx_unlink(ctx: FExitContext) -> u32 {
    unlinks::<BtfRegs>(&ctx)
}

#[fexit]
pub fn fx_unlink_stack(ctx: FExitContext) -> u32 {
    unlinks::<StackRegs>(&ctx)
}
