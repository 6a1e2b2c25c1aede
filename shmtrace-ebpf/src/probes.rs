//! The programs, one per hook. Each returns as early as it can: a cheap test
//! of the return value or signal number, then the traced-process lookup, and
//! only then reads kernel memory or reserves an event.

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_probe_read_kernel_str_bytes, bpf_probe_read_user, bpf_probe_read_user_str_bytes,
    },
    macros::{btf_tracepoint, raw_tracepoint, tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext, TracePointContext},
};
use shmtrace_common::{EDQUOT, EFBIG, ENOMEM, ENOSPC, EventKind, SIGBUS, lost, traced};

use crate::{
    emit::{self, Ring, SHM_MAPPED, TMPFS_FDS, TRACED},
    kernel::{self, nr, off},
};

const MAP_ANONYMOUS: u64 = 0x20;
const O_CREAT: u64 = 0o100;

/// sched_process_fork(parent, child): follow new processes of traced parents.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn sched_process_fork(ctx: RawTracePointContext) -> u32 {
    let parent = kernel::current_task();
    let ptgid = kernel::task_tgid(parent);
    let flags = emit::flags(ptgid);
    let all = kernel::all_processes();
    if flags == 0 && !all {
        return 0;
    }
    let child: u64 = ctx.arg(1);
    let pid = kernel::task_pid(child);
    if pid == 0 || pid != kernel::task_tgid(child) {
        return 0; // a thread: its process is already traced
    }
    if !all && flags & traced::FOLLOW != 0 {
        let v = traced::REPORT | traced::FOLLOW;
        if TRACED.insert(pid, v, 0).is_err() {
            emit::count_lost(lost::TRACED_FULL);
        }
    }
    if let Some(sb) = unsafe { SHM_MAPPED.get(ptgid) }.copied() {
        let _ = SHM_MAPPED.insert(pid, sb, 0);
    }
    if (flags & traced::REPORT != 0 || all)
        && let Some(mut e) = emit::start(Ring::Events, EventKind::Fork)
    {
        emit::body(&mut e).args[0] = pid as u64;
        e.submit(0);
    }
    0
}

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    let tgid = (aya_ebpf::helpers::bpf_get_current_pid_tgid() >> 32) as u32;
    if !emit::is_traced(tgid) {
        return 0;
    }
    let Some(mut e) = emit::start(Ring::Events, EventKind::Exec) else {
        return 0;
    };
    let ev = emit::body(&mut e);
    let base = ctx.as_ptr() as u64;
    if let Some(loc) = kernel::read::<u32>(base, off!(tp_exec_filename)) {
        let name = base + (loc & 0xffff) as u64;
        let _ = unsafe { bpf_probe_read_kernel_str_bytes(name as *const u8, &mut ev.path) };
    }
    ev.args[0] = kernel::read::<u32>(base, off!(tp_exec_old_pid)).unwrap_or(0) as u64;
    e.submit(0);
    0
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = aya_ebpf::helpers::bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if !emit::is_traced(tgid) {
        return 0;
    }
    // group_dead exists on 6.18+; before that the leader's exit stands in.
    let group_dead = match kernel::read::<u8>(ctx.as_ptr() as u64, off!(tp_exit_group_dead)) {
        Some(v) => v != 0,
        None => tid == tgid,
    };
    if !group_dead {
        return 0;
    }
    let code = kernel::read::<i32>(kernel::current_task(), off!(task_exit_code)).unwrap_or(0);
    if let Some(mut e) = emit::start(Ring::Events, EventKind::Exit) {
        let ev = emit::body(&mut e);
        ev.ret = code as i64;
        ev.args[0] = 1;
        e.submit(0);
    }
    let _ = TRACED.remove(tgid);
    let _ = SHM_MAPPED.remove(tgid);
    0
}

/// signal_generate(sig, info, task, group, result): raw, for si_addr.
#[raw_tracepoint(tracepoint = "signal_generate")]
pub fn signal_generate(ctx: RawTracePointContext) -> u32 {
    let sig: u64 = ctx.arg(0);
    if sig as u32 != SIGBUS {
        return 0;
    }
    let task: u64 = ctx.arg(2);
    let tgid = kernel::task_tgid(task);
    if !emit::is_traced(tgid) {
        return 0;
    }
    let info: u64 = ctx.arg(1);
    let group: u64 = ctx.arg(3);
    let result: u64 = ctx.arg(4);
    let Some(mut e) = emit::start(Ring::Failures, EventKind::SignalGenerate) else {
        return 0;
    };
    let ev = emit::body(&mut e);
    // SEND_SIG_NOINFO (0) and SEND_SIG_PRIV (1) are not pointers.
    if info > 1 {
        ev.ret = kernel::read::<i32>(info, 4).unwrap_or(0) as i64;
        ev.args[1] = kernel::read::<i32>(info, 8).unwrap_or(0) as i64 as u64;
        ev.args[2] = kernel::read::<u64>(info, 16).unwrap_or(0);
    }
    // How full the tmpfs it last mapped is, now, at the fault: user space
    // keeps it when the fault address turns out to be on that tmpfs.
    if let Some(&sb) = unsafe { SHM_MAPPED.get(tgid) } {
        kernel::fill_fs_info(&mut ev.file, sb);
    }
    ev.args[0] = sig;
    ev.args[3] = tgid as u64;
    ev.args[4] = kernel::task_pid(task) as u64;
    ev.args[5] = (result & 0xffff_ffff) | (group & 0xffff_ffff) << 32;
    e.submit(0);
    0
}

#[tracepoint(category = "signal", name = "signal_deliver")]
pub fn signal_deliver(ctx: TracePointContext) -> u32 {
    let base = ctx.as_ptr() as u64;
    let sig = kernel::read::<i32>(base, off!(tp_deliver_sig)).unwrap_or(0);
    if sig as u32 != SIGBUS {
        return 0;
    }
    let tgid = (aya_ebpf::helpers::bpf_get_current_pid_tgid() >> 32) as u32;
    if !emit::is_traced(tgid) {
        return 0;
    }
    if let Some(mut e) = emit::start(Ring::Failures, EventKind::SignalDeliver) {
        let ev = emit::body(&mut e);
        ev.args[0] = sig as u64;
        ev.args[1] = kernel::read::<i32>(base, off!(tp_deliver_code)).unwrap_or(0) as i64 as u64;
        ev.args[2] = kernel::read::<u64>(base, off!(tp_deliver_handler)).unwrap_or(0);
        e.submit(0);
    }
    0
}

#[tracepoint(category = "oom", name = "mark_victim")]
pub fn oom_mark_victim(ctx: TracePointContext) -> u32 {
    let pid = kernel::read::<i32>(ctx.as_ptr() as u64, off!(tp_victim_pid)).unwrap_or(0) as u32;
    if pid == 0 || !emit::is_traced(pid) {
        return 0;
    }
    if let Some(mut e) = emit::start(Ring::Failures, EventKind::OomVictim) {
        let ev = emit::body(&mut e);
        ev.args[0] = pid as u64;
        ev.args[1] =
            kernel::read::<u64>(ctx.as_ptr() as u64, off!(tp_victim_shmem_rss)).unwrap_or(0);
        e.submit(0);
    }
    0
}

/// raw_syscalls sys_exit(regs, ret), BTF-typed: one hook for every syscall
/// we watch, so a process pays one cheap test per syscall whatever it calls.
/// Typed `regs` are read with plain loads, no helper call on this hot path.
#[btf_tracepoint(function = "sys_exit")]
pub fn sys_exit(ctx: BtfTracePointContext) -> u32 {
    let regs: *const u8 = ctx.arg(0);
    let ret: i64 = ctx.arg(1);
    let nr_off = off!(regs_nr) as usize;
    // SAFETY: the verifier checks this load against struct pt_regs.
    let nr = unsafe { *(regs.add(nr_off) as *const u64) } as u32;
    let regs = regs as u64;
    if ret < 0 {
        on_failure(regs, nr, ret);
    } else if nr == nr!(mmap) {
        on_mmap(regs, ret);
    } else if nr == nr!(munmap) || nr == nr!(mremap) {
        on_unmap_or_remap(regs, nr, ret);
    } else if nr == nr!(ftruncate) {
        on_truncate(regs);
    } else if nr == nr!(openat) || nr == nr!(open) || nr == nr!(openat2) || nr == nr!(creat) {
        on_open(regs, nr, ret);
    } else if nr == nr!(close) {
        on_close(regs);
    } else if nr == nr!(recvmsg) {
        on_recvmsg(regs);
    }
    0
}

/// fds that arrive over a unix socket (how PyTorch passes its segments):
/// only a recvmsg that returned control data (msg_controllen > 0 after the
/// call) can carry SCM_RIGHTS, so only those are reported.
#[inline(always)]
fn on_recvmsg(regs: u64) {
    let tgid = tgid();
    if !emit::is_traced(tgid) {
        return;
    }
    // struct user_msghdr: msg_controllen (a size_t) at byte 40 on 64-bit.
    let msg = arg(regs, 1);
    let controllen = unsafe { bpf_probe_read_user((msg + 40) as *const u64) }.unwrap_or(0);
    if controllen == 0 {
        return;
    }
    if let Some(mut e) = emit::start(Ring::Events, EventKind::RecvFds) {
        let ev = emit::body(&mut e);
        ev.syscall = nr!(recvmsg);
        ev.args[0] = controllen;
        e.submit(0);
    }
}

/// Who holds tmpfs files by fd: opens of tmpfs files...
#[inline(always)]
fn on_open(regs: u64, nr: u32, fd: i64) {
    // Only creations: files opened without O_CREAT (a consumer opening a
    // named segment) show up when mapped, and the fd rescan finds them.
    let flags = if nr == nr!(openat) {
        arg(regs, 2)
    } else if nr == nr!(open) {
        arg(regs, 1)
    } else if nr == nr!(creat) {
        O_CREAT
    } else {
        // openat2(dirfd, path, struct open_how *how, size): how->flags first.
        unsafe { bpf_probe_read_user(arg(regs, 2) as *const u64) }.unwrap_or(0)
    };
    if flags & O_CREAT == 0 {
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
    let key = (tgid as u64) << 32 | fd as u64 & 0xffff_ffff;
    let _ = TMPFS_FDS.insert(key, 1, 0);
    let Some(mut e) = emit::start(Ring::Events, EventKind::Open) else {
        return;
    };
    let ev = emit::body(&mut e);
    ev.syscall = nr;
    ev.ret = fd;
    for i in 0..4 {
        ev.args[i] = arg(regs, i);
    }
    kernel::fill_file_info(&mut ev.file, file, inode);
    e.submit(0);
}

/// ...and closes of those fds.
#[inline(always)]
fn on_close(regs: u64) {
    let tgid = tgid();
    let fd = arg(regs, 0);
    let key = (tgid as u64) << 32 | fd & 0xffff_ffff;
    if unsafe { TMPFS_FDS.get(key) }.is_none() {
        return;
    }
    let _ = TMPFS_FDS.remove(key);
    if let Some(mut e) = emit::start(Ring::Events, EventKind::Close) {
        let ev = emit::body(&mut e);
        ev.syscall = nr!(close);
        ev.args[0] = fd;
        e.submit(0);
    }
}

#[inline(always)]
fn arg(regs: u64, i: usize) -> u64 {
    let off = off!(regs_args[i]) as u64;
    // SAFETY: `regs` is the typed pt_regs of tp_btf/sys_exit: the verifier
    // checks this load against the struct, so no helper call is needed.
    unsafe { *((regs + off) as *const u64) }
}

#[inline(always)]
fn tgid() -> u32 {
    (aya_ebpf::helpers::bpf_get_current_pid_tgid() >> 32) as u32
}

#[inline(always)]
fn on_failure(regs: u64, nr: u32, ret: i64) {
    let errno = -ret;
    let is_map = nr == nr!(mmap) || nr == nr!(mremap);
    if !is_map && errno != ENOSPC && errno != EDQUOT && errno != EFBIG && errno != ENOMEM {
        return;
    }
    let by_fd = nr == nr!(write)
        || nr == nr!(pwrite64)
        || nr == nr!(writev)
        || nr == nr!(pwritev)
        || nr == nr!(pwritev2)
        || nr == nr!(fallocate)
        || nr == nr!(ftruncate)
        || nr == nr!(mmap);
    let by_path = nr == nr!(open) || nr == nr!(openat) || nr == nr!(openat2) || nr == nr!(creat);
    if !(by_fd || by_path || nr == nr!(mremap)) || !emit::is_traced(tgid()) {
        return;
    }
    // Only failures on tmpfs files are shm failures: test the fd's filesystem
    // here. Paths (open*) and mremap ranges are classified in user space.
    let (file, inode) = if by_fd {
        let fd = if nr == nr!(mmap) {
            arg(regs, 4)
        } else {
            arg(regs, 0)
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
    let Some(mut e) = emit::start(Ring::Failures, EventKind::SyscallFail) else {
        return;
    };
    let ev = emit::body(&mut e);
    ev.syscall = nr;
    ev.ret = ret;
    for i in 0..6 {
        ev.args[i] = arg(regs, i);
    }
    if inode != 0 {
        kernel::fill_file_info(&mut ev.file, file, inode);
        if nr == nr!(write) || nr == nr!(writev) {
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
        let _ = unsafe { bpf_probe_read_user_str_bytes(p as *const u8, &mut ev.path) };
    }
    e.submit(0);
}

#[inline(always)]
fn on_mmap(regs: u64, addr: i64) {
    let flags = arg(regs, 3);
    if flags & MAP_ANONYMOUS != 0 {
        return;
    }
    let tgid = tgid();
    if !emit::is_traced(tgid) {
        return;
    }
    let file = kernel::fd_file(arg(regs, 4));
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
        ev.args[i] = arg(regs, i);
    }
    kernel::fill_file_info(&mut ev.file, file, inode);
    e.submit(0);
}

/// Sizes of mapped tmpfs files: tells a fault past the end of a file (not
/// an allocation failure) from a full tmpfs.
#[inline(always)]
fn on_truncate(regs: u64) {
    if !emit::is_traced(tgid()) {
        return;
    }
    let file = kernel::fd_file(arg(regs, 0));
    let inode = kernel::tmpfs_inode(file);
    if inode == 0 {
        return;
    }
    let Some(mut e) = emit::start(Ring::Events, EventKind::Truncate) else {
        return;
    };
    let ev = emit::body(&mut e);
    ev.syscall = nr!(ftruncate);
    ev.args[0] = arg(regs, 0);
    ev.args[1] = arg(regs, 1);
    kernel::fill_file_info(&mut ev.file, file, inode);
    e.submit(0);
}

#[inline(always)]
fn on_unmap_or_remap(regs: u64, nr: u32, ret: i64) {
    let tgid = tgid();
    // Only processes that ever mapped tmpfs: Python frees arenas all the time.
    if unsafe { SHM_MAPPED.get(tgid) }.is_none() || !emit::is_traced(tgid) {
        return;
    }
    let kind = if nr == nr!(munmap) {
        EventKind::Unmap
    } else {
        EventKind::Remap
    };
    let Some(mut e) = emit::start(Ring::Events, kind) else {
        return;
    };
    let ev = emit::body(&mut e);
    ev.syscall = nr;
    ev.ret = ret;
    ev.args[0] = arg(regs, 0);
    ev.args[1] = arg(regs, 1);
    ev.args[2] = arg(regs, 2);
    e.submit(0);
}
