//! The trampoline backend: fexit programs on the kernel functions that do
//! tmpfs's work, each the same handler as a syscall exit program (see
//! `syscalls`, `unlink`), with the syscall's number and arguments read from
//! the task's saved registers. A syscall tracepoint puts every syscall of
//! every process on the kernel's slow path; a trampoline runs only when its
//! function does: tmpfs's own (shmem_fallocate, shmem_unlink, the write
//! path's write_iter) cost nothing to a process that never touches tmpfs,
//! and the few every process calls (do_sys_openat2, vm_mmap_pgoff) pay a
//! direct call and a return-value test. The loader picks, per need, these
//! or the tracepoint programs (capture/hooks.rs). An fexit program reads
//! the function's return value as the argument after its last one, so each
//! is written for its function's parameter count, which the loader checks
//! against BTF before it loads one.

use aya_ebpf::{macros::fexit, programs::FExitContext};

use crate::{
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

/// do_sys_openat2(dfd, filename, how): every open(2), openat(2),
/// openat2(2) and creat(2); failures, and tmpfs files created. An open
/// that succeeded without O_CREAT (the everyday case) stops at the flags
/// of its own `how`, one read, before the registers are looked at.
#[inline(always)]
fn opens<R: Regs>(ctx: &FExitContext) -> u32 {
    let ret = ret::<3>(ctx);
    if ret >= 0
        && crate::kernel::read::<u64>(ctx.arg::<u64>(2), 0).is_some_and(|f| f & O_CREAT == 0)
    {
        return 0;
    }
    let Some((regs, nr)) = R::current_any() else {
        return 0;
    };
    if ret < 0 {
        syscalls::on_failure::<R, { fam::OPENS }>(regs, nr, ret);
    } else {
        syscalls::on_open(regs, nr, ret);
    }
    0
}

#[fexit]
pub fn fx_opens(ctx: FExitContext) -> u32 {
    opens::<BtfRegs>(&ctx)
}

#[fexit]
pub fn fx_opens_stack(ctx: FExitContext) -> u32 {
    opens::<StackRegs>(&ctx)
}

/// vm_mmap_pgoff(file, addr, len, prot, flag, pgoff): every mmap(2); the
/// anonymous ones that succeed (the everyday case) stop at the first test.
#[inline(always)]
fn mmap<R: Regs>(ctx: &FExitContext) -> u32 {
    let ret = ret::<6>(ctx);
    let file = ctx.arg::<u64>(0);
    if file == 0 && ret >= 0 {
        return 0;
    }
    let Some((regs, nr)) = R::current_any() else {
        return 0;
    };
    if nr != crate::kernel::nr!(mmap) {
        return 0; // shmat, a driver's own mapping: not mmap(2)
    }
    if ret < 0 {
        syscalls::on_failure::<R, { fam::MMAP }>(regs, nr, ret);
    } else {
        syscalls::on_mmap(regs, ret);
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
    if nr != crate::kernel::nr!(ftruncate) {
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
    if ret::<2>(ctx) != 0 {
        return 0;
    }
    if let Some((regs, nr)) = R::current_any()
        && (nr == crate::kernel::nr!(unlink) || nr == crate::kernel::nr!(unlinkat))
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
