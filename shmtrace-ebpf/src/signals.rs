//! SIGBUS: generated (with si_code and the fault address) and delivered
//! (whether a handler runs). Both go to the failures ring.

use aya_ebpf::{
    EbpfContext,
    helpers::bpf_get_current_pid_tgid,
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
};
use shmtrace_common::{EventKind, SIGBUS};

/// si_code of a kill() by a user process, and of a signal the kernel sent.
const SI_USER: i32 = 0;
const SI_KERNEL: i32 = 0x80;

use crate::{
    emit::{self, Ring, SHM_MAPPED},
    kernel::{self, off},
};

/// signal_generate(sig, info, task, group, result): raw, for si_addr.
///
/// Early exits, cheapest first: not SIGBUS (an argument test), then the
/// target is not traced (one map lookup). A SIGBUS a process sent (kill,
/// tgkill, raise: si_code <= 0) is no fault: it goes to the ordinary ring
/// within a small budget, never to the failures ring, so a process that
/// signals itself in a loop cannot hide a real failure.
#[raw_tracepoint(tracepoint = "signal_generate")]
pub fn signal_generate(ctx: RawTracePointContext) -> u32 {
    let sig: u64 = ctx.arg(0);
    if sig as u32 != SIGBUS {
        return 0;
    }
    let ts = emit::now();
    let task: u64 = ctx.arg(2);
    let tgid = kernel::task_tgid(task);
    if !emit::is_traced(tgid) {
        return 0;
    }
    let info: u64 = ctx.arg(1);
    // SEND_SIG_NOINFO (0) is a user's kill; SEND_SIG_PRIV (1) the kernel's.
    // Otherwise kernel_siginfo: si_errno at 4, si_code at 8, si_addr at 16.
    let (errno, code, addr) = match info {
        0 => (0, SI_USER, 0),
        1 => (0, SI_KERNEL, 0),
        _ => (
            kernel::read::<i32>(info, 4).unwrap_or(0),
            kernel::read::<i32>(info, 8).unwrap_or(0),
            kernel::read::<u64>(info, 16).unwrap_or(0),
        ),
    };
    // SAFETY: the value is copied out at once; no reference is kept.
    let sb = unsafe { SHM_MAPPED.get(tgid) }.copied().unwrap_or(0);
    let entry = if code <= 0 {
        if !emit::sent_sigbus_allowed(tgid) {
            return 0;
        }
        emit::start(Ring::Events, EventKind::SignalGenerate)
    } else {
        let dev = kernel::sb_dev(sb);
        emit::start_failure(EventKind::SignalGenerate, tgid, dev, ts)
    };
    let Some(mut e) = entry else {
        return 0;
    };
    let ev = emit::body(&mut e);
    ev.ret = errno as i64;
    ev.args[1] = code as i64 as u64;
    ev.args[2] = addr;
    // How full the tmpfs it last mapped is, now, at the fault: user space
    // keeps it when the fault address turns out to be on that tmpfs.
    if sb != 0 {
        kernel::fill_fs_info(&mut ev.file, sb);
    }
    let group: u64 = ctx.arg(3);
    let result: u64 = ctx.arg(4);
    ev.args[0] = sig;
    ev.args[3] = tgid as u64;
    ev.args[4] = kernel::task_pid(task) as u64;
    ev.args[5] = (result & 0xffff_ffff) | (group & 0xffff_ffff) << 32;
    emit::submit_now(e);
    0
}

/// Early exits: not SIGBUS (one read of the record), then not traced. A
/// delivery of a sent SIGBUS spends the same budget as its generation.
#[tracepoint(category = "signal", name = "signal_deliver")]
pub fn signal_deliver(ctx: TracePointContext) -> u32 {
    let base = ctx.as_ptr() as u64;
    let sig = kernel::read::<i32>(base, off!(tp_deliver_sig)).unwrap_or(0);
    if sig as u32 != SIGBUS {
        return 0;
    }
    let ts = emit::now();
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !emit::is_traced(tgid) {
        return 0;
    }
    let code = kernel::read::<i32>(base, off!(tp_deliver_code)).unwrap_or(0);
    let entry = if code <= 0 {
        if !emit::sent_sigbus_allowed(tgid) {
            return 0;
        }
        emit::start(Ring::Events, EventKind::SignalDeliver)
    } else {
        // A fault's delivery: the budget, never the reserve (that is for
        // the fault's own record).
        emit::start_failure(EventKind::SignalDeliver, tgid, 0, ts)
    };
    if let Some(mut e) = entry {
        let ev = emit::body(&mut e);
        ev.args[0] = sig as u64;
        ev.args[1] = code as i64 as u64;
        ev.args[2] = kernel::read::<u64>(base, off!(tp_deliver_handler)).unwrap_or(0);
        emit::submit_now(e);
    }
    0
}
