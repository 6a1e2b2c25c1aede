//! Maps, the traced-process filter, and filling event headers.
//!
//! Two ring buffers so that a flood of ordinary events (fork, mmap, exit)
//! can never crowd out a failure: failures have a ring of their own. And
//! so that no process can crowd out another's failure there: each process
//! has a budget of failure records per second, SIGBUS sent by processes
//! (not faults) never go to it, and the first failure on each tmpfs mount
//! has a small ring in reserve.

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
    },
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray, RingBuf, ring_buf::RingBufEntry},
};
use shmtrace_common::{Budget, Event, EventKind, lost, rate, traced};

use crate::kernel;

/// tgid -> `traced::*` flags.
#[map]
pub static TRACED: HashMap<u32, u32> = HashMap::with_max_entries(65536, 0);

/// tgids that have (or inherited) a tmpfs mapping -> the superblock of the
/// last one (0 when unknown). Only their mremaps matter, and a SIGBUS is
/// sent with that tmpfs's usage at the fault.
#[map]
pub static SHM_MAPPED: HashMap<u32, u64> = HashMap::with_max_entries(65536, 0);

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(4 << 20, 0);

#[map]
static FAILURES: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// Only for the first failure on a mount whose record found FAILURES full.
#[map]
static FIRSTS: RingBuf = RingBuf::with_byte_size(64 << 10, 0);

/// tgid -> its failure-record budget. LRU: bounded whatever runs.
#[map]
pub static FAIL_RATE: LruHashMap<u32, Budget> = LruHashMap::with_max_entries(16384, 0);

/// Target tgid -> its budget of reported SIGBUS sent by processes.
#[map]
static SENT_RATE: LruHashMap<u32, Budget> = LruHashMap::with_max_entries(16384, 0);

/// Kernel devs of tmpfs mounts that already had a failure record.
#[map]
static FAILED_MOUNTS: LruHashMap<u32, u8> = LruHashMap::with_max_entries(4096, 0);

/// Per-CPU loss counters, indexed by `lost::*`.
#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(lost::COUNT, 0);

#[inline(always)]
pub fn count_lost(idx: u32) {
    if let Some(p) = LOST.get_ptr_mut(idx) {
        // SAFETY: a per-CPU slot: no other program writes it concurrently.
        unsafe { *p += 1 };
    }
}

#[inline(always)]
pub fn flags(tgid: u32) -> u32 {
    // SAFETY: the value is copied out at once; no reference is kept.
    unsafe { TRACED.get(tgid) }.copied().unwrap_or(0)
}

/// Whether events of `tgid` are reported. Never shmtrace's own.
#[inline(always)]
pub fn is_traced(tgid: u32) -> bool {
    if tgid == kernel::self_tgid() {
        return false;
    }
    kernel::all_processes() || flags(tgid) & traced::REPORT != 0
}

/// Takes one from `tgid`'s budget in `map` (at most `per_window` per
/// window); false, counted there and in `lost_idx`, when it has none left.
#[inline(always)]
fn spend(map: &LruHashMap<u32, Budget>, tgid: u32, per_window: u32, lost_idx: u32) -> bool {
    let now = now();
    let Some(b) = map.get_ptr_mut(tgid) else {
        let fresh = Budget {
            window_start_ns: now,
            used: 1,
            ..Budget::default()
        };
        // A full LRU evicts the stalest process's budget: bounded memory.
        let _ = map.insert(tgid, fresh, 0);
        return true;
    };
    // SAFETY: a map value pointer valid for this program's run. Races
    // between CPUs on one process's budget only blur its counts.
    let b = unsafe { &mut *b };
    if now.wrapping_sub(b.window_start_ns) > rate::WINDOW_NS {
        b.window_start_ns = now;
        b.used = 0;
    }
    if b.used >= per_window {
        b.suppressed += 1;
        count_lost(lost_idx);
        return false;
    }
    b.used += 1;
    true
}

/// Whether a SIGBUS sent to `target` by a process may be reported now.
#[inline(always)]
pub fn sent_sigbus_allowed(target: u32) -> bool {
    spend(&SENT_RATE, target, rate::SENT_SIGBUS, lost::SENT_SIGBUS)
}

/// The kernel's monotonic clock. Failure programs read it first thing,
/// before any map look-up or ring reservation: two workers failing on two
/// CPUs tens of nanoseconds apart must keep their order, and a look-up or
/// a reservation under contention takes longer than that.
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: a helper without arguments or side effects.
    unsafe { bpf_ktime_get_ns() }
}

/// Reserves a failure record of process `tgid` about tmpfs `dev` (0 when
/// unknown here), stamped `ts_ns` (read by the caller on entry). The first
/// failure on a mount always passes, and falls back to the reserved ring;
/// the others spend the process's budget.
#[inline(always)]
pub fn start_failure(
    kind: EventKind,
    tgid: u32,
    dev: u32,
    ts_ns: u64,
) -> Option<RingBufEntry<Event>> {
    // SAFETY: only presence is tested; no reference is kept.
    let first = dev != 0 && unsafe { FAILED_MOUNTS.get(dev) }.is_none();
    let mut e = if first {
        let _ = FAILED_MOUNTS.insert(dev, 1, 0);
        match reserve(&FIRSTS, kind, ts_ns) {
            Some(e) => e,
            None => {
                count_lost(lost::FIRST);
                start_at(Ring::Failures, kind, ts_ns)?
            }
        }
    } else {
        if !spend(&FAIL_RATE, tgid, rate::FAILURES, lost::RATE_LIMITED) {
            return None;
        }
        start_at(Ring::Failures, kind, ts_ns)?
    };
    // The limit that applies to the failing task's pages (rare path).
    with_memcg(&mut e);
    Some(e)
}

/// Stamps the current task's memory cgroup id on `e`: a few reads, kept to
/// failures and the tmpfs events that wake user space.
#[inline(always)]
fn with_memcg(e: &mut RingBufEntry<Event>) {
    body(e).memcg_id = kernel::task_memcg_id(kernel::current_task());
}

pub enum Ring {
    Events,
    Failures,
}

/// Reserves a zeroed event with its header filled from the current task.
/// Counts the loss when the ring is full.
#[inline(always)]
pub fn start(ring: Ring, kind: EventKind) -> Option<RingBufEntry<Event>> {
    start_at(ring, kind, now())
}

/// `start`, stamped `ts_ns`.
#[inline(always)]
fn start_at(ring: Ring, kind: EventKind, ts_ns: u64) -> Option<RingBufEntry<Event>> {
    let (rb, idx) = match ring {
        Ring::Events => (&EVENTS, lost::EVENT),
        Ring::Failures => (&FAILURES, lost::FAILURE),
    };
    let entry = reserve(rb, kind, ts_ns);
    if entry.is_none() {
        count_lost(idx);
    }
    entry
}

/// Reserves a zeroed, headed event on `rb`, stamped `ts_ns`; None when it
/// is full.
#[inline(always)]
fn reserve(rb: &RingBuf, kind: EventKind, ts_ns: u64) -> Option<RingBufEntry<Event>> {
    let mut entry = rb.reserve::<Event>(0)?;
    let ev = entry.as_mut_ptr();
    let pid_tgid = bpf_get_current_pid_tgid();
    let task = kernel::current_task();
    // SAFETY: `ev` points to a reserved, exclusively owned ring entry the
    // size of an Event; zeroing it first means no stale bytes leave.
    unsafe {
        core::ptr::write_bytes(ev, 0, 1);
        let ev = &mut *ev;
        ev.kind = kind as u32;
        ev.ts_ns = ts_ns;
        ev.tgid = (pid_tgid >> 32) as u32;
        ev.tid = pid_tgid as u32;
        ev.ppid = kernel::task_ppid(task);
        ev.mnt_ns = kernel::task_mnt_ns(task);
        ev.ns_tgid = kernel::task_ns_tgid(task);
        ev.cgroup_id = bpf_get_current_cgroup_id();
        ev.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    }
    Some(entry)
}

/// Mount namespaces user space has anchored: the fork, exec and exit of
/// their processes need not wake it. LRU: bounded whatever runs.
#[map]
static KNOWN_NS: LruHashMap<u32, u8> = LruHashMap::with_max_entries(4096, 0);

/// bpf_ringbuf_submit/query flags.
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;
const BPF_RB_RING_SIZE: u64 = 1;
/// Past this much unread data (or a quarter of a smaller ring, sized by
/// --events-ring) the events ring wakes its reader anyway.
const WAKE_PAST: u64 = 1 << 20;

/// Submits an everyday event (fork, exec, exit) without waking the reader:
/// every process start on the node sends three, and a wakeup each put the
/// agent through a context switch per event. The agent drains the ring on
/// its own every 100-200 ms; a ring filling up wakes it at once, and so
/// does a failure or a process's first tmpfs event (`submit_now`,
/// `submit_tmpfs`: their reads of /proc must happen while it lives).
///
/// Only node-wide: a traced job's few processes wake it as before, and so
/// does a process of a mount namespace user space has not anchored yet
/// (it must be anchored while one of its processes lives).
#[inline(always)]
pub fn submit_quiet(mut e: RingBufEntry<Event>) {
    let ns = body(&mut e).mnt_ns;
    // SAFETY: only presence is tested; no reference is kept.
    let known = unsafe { KNOWN_NS.get(ns) }.is_some();
    // The ring's size is asked only when the cheaper tests let it matter.
    let flags = if !kernel::all_processes()
        || !known
        || EVENTS.query(BPF_RB_AVAIL_DATA) > WAKE_PAST.min(EVENTS.query(BPF_RB_RING_SIZE) / 4)
    {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    e.submit(flags);
}

/// Submits a record that user space must see at once: a failure, or the
/// first tmpfs event of a process (`submit_tmpfs`). Forced: the kernel
/// wakes the reader on a plain submit only when every earlier record was
/// read, and quiet records before it may not have been.
#[inline(always)]
pub fn submit_now(e: RingBufEntry<Event>) {
    e.submit(BPF_RB_FORCE_WAKEUP);
}

/// Node-wide, processes whose tmpfs events woke user space once (removed
/// at exit; an evicted entry only costs one more wakeup).
#[map]
static WOKE: LruHashMap<u32, u8> = LruHashMap::with_max_entries(16384, 0);

/// Submits an ordinary tmpfs event (open, mmap, mremap, ftruncate,
/// unlink, fds received). The first of each process wakes user space at
/// once, stamped with its memory cgroup: its /proc reads (command line,
/// its namespace's mounts) must happen while it lives. Its later ones are
/// quiet like fork/exec/exit (`submit_quiet`): a worker cycling segments
/// woke the agent for each, and the wakeups, not the events, were most of
/// its CPU.
/// A failure's wakeup drains them first, in kernel-time order.
#[inline(always)]
pub fn submit_tmpfs(mut e: RingBufEntry<Event>) {
    if !kernel::all_processes() {
        with_memcg(&mut e);
        e.submit(BPF_RB_FORCE_WAKEUP);
        return;
    }
    let tgid = body(&mut e).tgid;
    // SAFETY: only presence is tested; no reference is kept.
    if unsafe { WOKE.get(tgid) }.is_none() {
        let _ = WOKE.insert(tgid, 1, 0);
        with_memcg(&mut e);
        e.submit(BPF_RB_FORCE_WAKEUP);
        return;
    }
    submit_quiet(e);
}

/// A process is gone: its next namesake wakes user space again.
#[inline(always)]
pub fn forget_woken(tgid: u32) {
    let _ = WOKE.remove(tgid);
}

/// The event behind a reserved entry.
#[inline(always)]
pub fn body(entry: &mut RingBufEntry<Event>) -> &mut Event {
    // SAFETY: the entry was zeroed and headed by `start`, so it holds a
    // valid Event, and the borrow of `entry` keeps it exclusive.
    unsafe { &mut *entry.as_mut_ptr() }
}
