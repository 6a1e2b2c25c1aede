//! Removals of shared-memory files (unlink, unlinkat): who removed a
//! segment that another process then finds gone ("No such file or
//! directory"). From any process: a cleanup job is what this is for.

use aya_ebpf::{
    helpers::bpf_probe_read_user_str_bytes, macros::tracepoint, programs::TracePointContext,
};
use shmtrace_common::EventKind;

use crate::{
    emit::{self, Ring},
    kernel::{self, nr, off},
    sysexit::{BtfRegs, Regs, StackRegs, exit_record, is_shm_path},
};

const AT_FDCWD: i64 = -100;
const AT_REMOVEDIR: u64 = 0x200;

/// unlink, unlinkat: who removed a shared-memory file (the answer when
/// another process then finds it gone: "No such file or directory").
#[tracepoint]
pub fn sys_exit_unlink(ctx: TracePointContext) -> u32 {
    unlink::<BtfRegs>(&ctx)
}

/// `sys_exit_unlink` for kernels before 5.15.
#[tracepoint]
pub fn sys_exit_unlink_stack(ctx: TracePointContext) -> u32 {
    unlink::<StackRegs>(&ctx)
}

#[inline(always)]
fn unlink<R: Regs>(ctx: &TracePointContext) -> u32 {
    let (nr, ret) = exit_record(ctx);
    if ret == 0
        && let Some(regs) = R::current(nr)
    {
        on_unlink(regs, nr);
    }
    0
}

/// Only `/dev/shm/...` paths (what shm_unlink and sem_unlink pass) and
/// names in a tmpfs directory fd (`find -delete`, systemd's RemoveIPC).
/// From any process, traced or not: a cleanup job removing a traced job's
/// segments is the case this is for; unlink is rare and the path test
/// comes first.
#[inline(always)]
pub(crate) fn on_unlink<R: Regs>(regs: R, nr: u32) {
    let (dirfd, path) = if nr == nr!(unlinkat) {
        if regs.arg(2) & AT_REMOVEDIR != 0 {
            return;
        }
        (regs.arg(0) as i32 as i64, regs.arg(1))
    } else {
        (AT_FDCWD, regs.arg(0))
    };
    let mut dev = 0;
    if !is_shm_path(path) {
        if dirfd == AT_FDCWD {
            return;
        }
        let inode = kernel::tmpfs_inode(kernel::fd_file(dirfd as u64));
        if inode == 0 {
            return;
        }
        dev = kernel::sb_dev(kernel::read_ptr(inode, off!(inode_sb)));
    }
    let Some(mut e) = emit::start(Ring::Events, EventKind::Unlink) else {
        return;
    };
    let ev = emit::body(&mut e);
    ev.syscall = nr;
    ev.args[0] = dirfd as u64;
    ev.file.dev = dev;
    // SAFETY: a user pointer read with the checked helper, bounded by the
    // destination's length.
    let _ = unsafe { bpf_probe_read_user_str_bytes(path as *const u8, &mut ev.path) };
    emit::submit_tmpfs(e);
}
