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
    sysexit::{arg, exit_record, is_shm_path, user_regs},
};

const AT_FDCWD: i64 = -100;
const AT_REMOVEDIR: u64 = 0x200;

/// unlink, unlinkat: who removed a shared-memory file (the answer when
/// another process then finds it gone: "No such file or directory").
#[tracepoint]
pub fn sys_exit_unlink(ctx: TracePointContext) -> u32 {
    let (nr, ret) = exit_record(&ctx);
    if ret == 0 {
        on_unlink(user_regs(), nr);
    }
    0
}

/// Only `/dev/shm/...` paths (what shm_unlink and sem_unlink pass) and
/// names in a tmpfs directory fd (`find -delete`, systemd's RemoveIPC).
/// From any process, traced or not: a cleanup job removing a traced job's
/// segments is the case this is for; unlink is rare and the path test
/// comes first.
#[inline(always)]
fn on_unlink(regs: u64, nr: u32) {
    let (dirfd, path) = if nr == nr!(unlinkat) {
        if arg(regs, 2) & AT_REMOVEDIR != 0 {
            return;
        }
        (arg(regs, 0) as i32 as i64, arg(regs, 1))
    } else {
        (AT_FDCWD, arg(regs, 0))
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
