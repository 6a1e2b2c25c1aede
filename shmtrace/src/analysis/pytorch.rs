//! PyTorch: what its DataLoader keeps in flight, telling it from
//! torch.multiprocessing, what it prints, and settings that fit a size.

use super::{
    scope::Scope,
    segments::{largest_segment, workers_allocating},
    users::{TORCH_GONE, User},
    words::human_mib,
};
use crate::{
    event::Syscall,
    state::{
        failures::{FailureKind, Op},
        procs::Proc,
    },
    units::human_bytes,
};

/// PyTorch's default DataLoader prefetch_factor.
pub(super) const PREFETCH: u64 = 2;

/// What a DataLoader keeps in /dev/shm at most: (workers x prefetch_factor
/// + 2) batches of the largest segment.
pub(super) fn dataloader_in_flight(r: &Scope) -> u64 {
    (workers_allocating(r) * PREFETCH + 2) * largest_segment(r)
}

/// A PyTorch DataLoader or torch.multiprocessing? PyTorch 2.x names its
/// DataLoader workers pt_data_worker, so segments made by processes of no
/// such name with posix_fallocate (2.x's allocator) are not a DataLoader's;
/// with either version, a consumer holding more than a DataLoader ever
/// keeps in flight is not one either.
pub(super) fn pytorch_kind(r: &Scope, user: User) -> User {
    if user != User::PytorchDataLoader {
        return user;
    }
    if r.processes
        .iter()
        .any(|p| p.comm.starts_with("pt_data_worker"))
    {
        return user;
    }
    let Some(first) = r.first_failure else {
        return user;
    };
    // A segment found gone fails in its consumer, never in a worker: with
    // no worker by name, nothing says DataLoader.
    if first.kind == FailureKind::Enoent {
        return User::PytorchMultiprocessing;
    }
    let in_flight = dataloader_in_flight(r);
    let keeps = first
        .holders
        .iter()
        .any(|h| h.pid != first.pid && in_flight > 0 && h.held_bytes > in_flight);
    if keeps || first.syscall_is(Syscall::Fallocate) {
        User::PytorchMultiprocessing
    } else {
        user
    }
}

pub(super) fn pytorch_messages(
    r: &Scope,
    first: u32,
    kind: FailureKind,
    syscall: Option<Op>,
    workers: &[&Proc],
    first_index: Option<usize>,
) -> (Option<String>, Option<String>) {
    use FailureKind::{Enoent, Enospc, MmapError, Sigbus};
    let sc = match syscall {
        Some(Op::Syscall(sc)) => Some(sc),
        _ => None,
    };
    match (kind, sc) {
        (Sigbus, _) => {
            let mut dead: Vec<u32> = r
                .failures
                .iter()
                .filter(|f| f.kind == Sigbus)
                .map(|f| f.pid)
                .filter(|pid| r.processes.iter().any(|p| p.pid == *pid && p.exit_signal == Some(7)))
                .collect();
            dead.sort();
            let named_host = dead.first().copied().unwrap_or(first);
            // PyTorch prints pids as its container sees them.
            let ns_of = |pid: u32| {
                r.processes
                    .iter()
                    .find(|p| p.pid == pid)
                    .and_then(|p| p.ns_pid)
                    .or_else(|| r.failures.iter().find(|f| f.pid == pid).and_then(|f| f.ns_pid))
            };
            let named = ns_of(named_host).unwrap_or(named_host);
            let first_shown = ns_of(first).unwrap_or(first);
            let msg = format!(
                "DataLoader worker (pid {named}) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory. Please try to raise your shared memory limit."
            );
            let wrong = (named_host != first).then(|| {
                format!(
                    "PyTorch names pid {named}: it checks its workers in pid order and reports the first dead one it finds. The first worker to fail was pid {first_shown}; pid {named} failed after it, as collateral."
                )
            });
            (Some(msg), wrong)
        }
        (Enospc, Some(Syscall::Fallocate | Syscall::Write | Syscall::Pwrite64)) => {
            let verb = if sc == Some(Syscall::Fallocate) { "allocate shared memory(shm) for" } else { "write to" };
            let msg = format!(
                "RuntimeError: Caught RuntimeError in DataLoader worker process K. ... unable to {verb} file </torch_...>: No space left on device (28)"
            );
            let wrong = first_index.map(|i| {
                format!(
                    "PyTorch reports the worker whose batch it was waiting for (\"worker process K\"), not the first to fail: that was worker {i} (pid {first}) of {}.",
                    workers.len()
                )
            });
            (Some(msg), wrong)
        }
        (MmapError, _) => (
            Some("RuntimeError: unable to mmap N bytes from file </torch_...>: Cannot allocate memory (12)".into()),
            None,
        ),
        (Enospc, Some(Syscall::Openat)) => (Some("OSError: [Errno 28] No space left on device".into()), None),
        (Enoent, _) => (Some(TORCH_GONE.into()), None),
        _ => (None, None),
    }
}

/// Settings that fit the current size: in flight are
/// (num_workers x prefetch_factor + 2) batches, with 20% kept spare.
pub(super) fn dataloader_fit(
    r: &Scope,
    pytorch: bool,
    size: Option<u64>,
    workers: u64,
) -> Option<String> {
    if !pytorch {
        return None;
    }
    let size = size?;
    let batch = Some(largest_segment(r)).filter(|b| *b > 0)?;
    let budget = size * 4 / 5;
    let workers = workers.max(1);
    let max_batch = budget / (workers * PREFETCH + 2);
    let mut ways = vec![format!(
        "with num_workers={workers} and prefetch_factor={PREFETCH}, batches must be at most {} (now {}: scale batch_size by {:.2})",
        human_bytes(max_batch),
        human_bytes(batch),
        max_batch as f64 / batch as f64
    )];
    let fit = budget / batch;
    if fit >= 2 + PREFETCH {
        ways.push(format!(
            "num_workers <= {} with prefetch_factor={PREFETCH}",
            (fit - 2) / PREFETCH
        ));
    }
    if fit >= 3 {
        ways.push(format!("num_workers <= {} with prefetch_factor=1", fit - 2));
    }
    if fit < 3 {
        ways.push("num_workers=0 (batches made in the main process, no /dev/shm)".into());
    }
    Some(format!(
        "to fit {}: {}",
        human_mib(size),
        ways.join("; or ")
    ))
}
