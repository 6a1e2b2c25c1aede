//! OOM kills: a process whose memory cgroup ran out, often because of the
//! /dev/shm pages charged to it.

use aya_ebpf::{EbpfContext, macros::tracepoint, programs::TracePointContext};
use shmtrace_common::EventKind;

use crate::{
    emit,
    kernel::{self, off},
};

/// Early exit: the victim is not traced. Rare: no cost worth ordering.
#[tracepoint(category = "oom", name = "mark_victim")]
pub fn oom_mark_victim(ctx: TracePointContext) -> u32 {
    let ts = emit::now();
    let base = ctx.as_ptr() as u64;
    let pid = kernel::read::<i32>(base, off!(tp_victim_pid)).unwrap_or(0) as u32;
    if pid == 0 || !emit::is_traced(pid) {
        return 0;
    }
    if let Some(mut e) = emit::start_failure(EventKind::OomVictim, pid, 0, ts) {
        let ev = emit::body(&mut e);
        ev.args[0] = pid as u64;
        ev.args[1] = kernel::read::<u64>(base, off!(tp_victim_shmem_rss)).unwrap_or(0);
        emit::submit_now(e);
    }
    0
}
