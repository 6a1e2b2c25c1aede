//! Process lifecycle: fork, exec, exit. These keep the traced set right
//! in the kernel (children of traced processes are traced from their first
//! instruction) and tell user space the process tree.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel_str_bytes},
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
};
use shmtrace_common::{EventKind, lost, traced};

use crate::{
    emit::{self, Ring, SHM_MAPPED, TRACED},
    kernel::{self, off},
};

/// sched_process_fork(parent, child): follow new processes of traced parents.
///
/// Early exits, cheapest first: parent not traced (one map lookup), then a
/// new thread rather than a process.
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
    // SAFETY: the value is copied out at once; no reference outlives the
    // lookup, so a concurrent update cannot be observed half-written.
    if let Some(sb) = unsafe { SHM_MAPPED.get(ptgid) }.copied() {
        let _ = SHM_MAPPED.insert(pid, sb, 0);
    }
    if (flags & traced::REPORT != 0 || all)
        && let Some(mut e) = emit::start(Ring::Events, EventKind::Fork)
    {
        emit::body(&mut e).args[0] = pid as u64;
        emit::submit_quiet(e);
    }
    0
}

/// Early exit: the current process is not traced.
#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !emit::is_traced(tgid) {
        return 0;
    }
    let Some(mut e) = emit::start(Ring::Events, EventKind::Exec) else {
        return 0;
    };
    let ev = emit::body(&mut e);
    let base = ctx.as_ptr() as u64;
    if let Some(loc) = kernel::read::<u32>(base, off!(tp_exec_filename)) {
        // __data_loc: the low 16 bits are the string's offset in the record.
        let name = base + (loc & 0xffff) as u64;
        // SAFETY: a kernel pointer into this tracepoint's record, read with
        // the checked helper, bounded by the destination's length.
        let _ = unsafe { bpf_probe_read_kernel_str_bytes(name as *const u8, &mut ev.path) };
    }
    ev.args[0] = kernel::read::<u32>(base, off!(tp_exec_old_pid)).unwrap_or(0) as u64;
    emit::submit_quiet(e);
    0
}

/// Early exits: a thread that is not the last of its group, then not traced.
#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // group_dead exists on 6.18+; before that the leader's exit stands in.
    let group_dead = match kernel::read::<u8>(ctx.as_ptr() as u64, off!(tp_exit_group_dead)) {
        Some(v) => v != 0,
        None => tid == tgid,
    };
    if !group_dead {
        return 0;
    }
    if !emit::is_traced(tgid) {
        return 0;
    }
    let code = kernel::read::<i32>(kernel::current_task(), off!(task_exit_code)).unwrap_or(0);
    if let Some(mut e) = emit::start(Ring::Events, EventKind::Exit) {
        let ev = emit::body(&mut e);
        ev.ret = code as i64;
        ev.args[0] = 1;
        emit::submit_quiet(e);
    }
    // The process is gone: its entries go with it (bounded maps).
    let _ = TRACED.remove(tgid);
    let _ = SHM_MAPPED.remove(tgid);
    emit::forget_woken(tgid);
    0
}
