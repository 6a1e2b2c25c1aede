//! SIGBUS: generated (with si_code and the fault address) and delivered
//! (whether a handler runs). Both go to the failures ring.

use aya_ebpf::{
    EbpfContext,
    helpers::bpf_get_current_pid_tgid,
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
};
use shmtrace_common::{EventKind, SIGBUS};

use crate::{
    emit::{self, Ring, SHM_MAPPED},
    kernel::{self, off},
};

/// signal_generate(sig, info, task, group, result): raw, for si_addr.
///
/// Early exits, cheapest first: not SIGBUS (an argument test), then the
/// target is not traced (one map lookup).
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
        // kernel_siginfo: si_errno at 4, si_code at 8, si_addr at 16 (UAPI layout).
        ev.ret = kernel::read::<i32>(info, 4).unwrap_or(0) as i64;
        ev.args[1] = kernel::read::<i32>(info, 8).unwrap_or(0) as i64 as u64;
        ev.args[2] = kernel::read::<u64>(info, 16).unwrap_or(0);
    }
    // How full the tmpfs it last mapped is, now, at the fault: user space
    // keeps it when the fault address turns out to be on that tmpfs.
    // SAFETY: the value is copied out at once; no reference is kept.
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

/// Early exits: not SIGBUS (one read of the record), then not traced.
#[tracepoint(category = "signal", name = "signal_deliver")]
pub fn signal_deliver(ctx: TracePointContext) -> u32 {
    let base = ctx.as_ptr() as u64;
    let sig = kernel::read::<i32>(base, off!(tp_deliver_sig)).unwrap_or(0);
    if sig as u32 != SIGBUS {
        return 0;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
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
