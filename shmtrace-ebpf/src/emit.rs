//! Maps, the traced-process filter, and filling event headers.
//!
//! Two ring buffers so that a flood of ordinary events (fork, mmap, exit)
//! can never crowd out a failure: failures have a ring of their own.

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
    },
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray, RingBuf, ring_buf::RingBufEntry},
};
use shmtrace_common::{Event, EventKind, lost, traced};

use crate::kernel;

/// tgid -> `traced::*` flags.
#[map]
pub static TRACED: HashMap<u32, u32> = HashMap::with_max_entries(65536, 0);

/// tgids that have (or inherited) a tmpfs mapping -> the superblock of the
/// last one (0 when unknown). Only their munmaps matter, and a SIGBUS is
/// sent with that tmpfs's usage at the fault.
#[map]
pub static SHM_MAPPED: HashMap<u32, u64> = HashMap::with_max_entries(65536, 0);

/// (tgid << 32 | fd) of tmpfs fds opened by traced processes: their closes
/// matter. LRU: entries of processes that exit are evicted, not leaked.
#[map]
pub static TMPFS_FDS: LruHashMap<u64, u8> = LruHashMap::with_max_entries(262144, 0);

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(4 << 20, 0);

#[map]
static FAILURES: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

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

/// Whether events of `tgid` are reported.
#[inline(always)]
pub fn is_traced(tgid: u32) -> bool {
    kernel::all_processes() || flags(tgid) & traced::REPORT != 0
}

pub enum Ring {
    Events,
    Failures,
}

/// Reserves a zeroed event with its header filled from the current task.
/// Counts the loss when the ring is full.
#[inline(always)]
pub fn start(ring: Ring, kind: EventKind) -> Option<RingBufEntry<Event>> {
    let (rb, idx) = match ring {
        Ring::Events => (&EVENTS, lost::EVENT),
        Ring::Failures => (&FAILURES, lost::FAILURE),
    };
    let Some(mut entry) = rb.reserve::<Event>(0) else {
        count_lost(idx);
        return None;
    };
    let ev = entry.as_mut_ptr();
    let pid_tgid = bpf_get_current_pid_tgid();
    let task = kernel::current_task();
    // SAFETY: `ev` points to a reserved, exclusively owned ring entry the
    // size of an Event; zeroing it first means no stale bytes leave.
    unsafe {
        core::ptr::write_bytes(ev, 0, 1);
        let ev = &mut *ev;
        ev.kind = kind as u32;
        ev.ts_ns = bpf_ktime_get_ns();
        ev.tgid = (pid_tgid >> 32) as u32;
        ev.tid = pid_tgid as u32;
        ev.ppid = kernel::task_ppid(task);
        ev.mnt_ns = kernel::task_mnt_ns(task);
        ev.cgroup_id = bpf_get_current_cgroup_id();
        ev.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    }
    Some(entry)
}

/// The event behind a reserved entry.
#[inline(always)]
pub fn body(entry: &mut RingBufEntry<Event>) -> &mut Event {
    // SAFETY: the entry was zeroed and headed by `start`, so it holds a
    // valid Event, and the borrow of `entry` keeps it exclusive.
    unsafe { &mut *entry.as_mut_ptr() }
}
