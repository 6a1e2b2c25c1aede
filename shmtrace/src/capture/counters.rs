//! What the kernel side did not send: records lost to a full ring, and
//! records held back on purpose (a process over its budget), with the
//! processes that were held back most.

use serde::Serialize;

/// Records lost: the picture may be incomplete.
#[derive(Clone, Copy, Debug, Default, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Losses {
    /// Ordinary events dropped because their ring buffer was full.
    pub events_ring: u64,
    /// Failure events dropped because their ring buffer was full.
    pub failures_ring: u64,
    /// New child processes that could not be followed (traced map full).
    pub traced_map_full: u64,
    /// First failures on a mount that found even the reserved ring full
    /// (they then tried the failures ring; a loss there is counted there).
    pub first_failure_reserve_full: u64,
}

impl Losses {
    /// Records that never reached user space.
    pub fn total(&self) -> u64 {
        self.events_ring + self.failures_ring + self.traced_map_full
    }
}

/// One process held back by its budget.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct SuppressedBy {
    /// The process held back.
    pub pid: u32,
    /// Failure records over its budget (the first on each mount never is).
    pub failure_records: u64,
    /// SIGBUS sent to it by a process (kill, raise), beyond the few reported.
    pub sent_sigbus: u64,
}

/// Records held back on purpose so one process cannot drown the others.
#[derive(Clone, Debug, Default, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Suppressed {
    /// Failure records over a process's budget, not sent (each still counted in the kernel).
    pub failure_records: u64,
    /// SIGBUS sent by processes (kill, raise) over the target's budget, not sent.
    pub sent_sigbus: u64,
    /// The processes held back most, at most [`Suppressed::TOP`].
    pub by_process: Vec<SuppressedBy>,
}

impl Suppressed {
    pub const TOP: usize = 10;

    /// Merges per-process counts from the two budget maps and keeps the top.
    pub fn top(
        failures: impl IntoIterator<Item = (u32, u64)>,
        sent: impl IntoIterator<Item = (u32, u64)>,
    ) -> Vec<SuppressedBy> {
        let mut by: std::collections::HashMap<u32, SuppressedBy> = Default::default();
        for (pid, n) in failures.into_iter().filter(|(_, n)| *n > 0) {
            let e = by.entry(pid).or_insert(SuppressedBy {
                pid,
                ..Default::default()
            });
            e.failure_records += n;
        }
        for (pid, n) in sent.into_iter().filter(|(_, n)| *n > 0) {
            let e = by.entry(pid).or_insert(SuppressedBy {
                pid,
                ..Default::default()
            });
            e.sent_sigbus += n;
        }
        let mut v: Vec<SuppressedBy> = by.into_values().collect();
        v.sort_by_key(|s| (std::cmp::Reverse(s.failure_records + s.sent_sigbus), s.pid));
        v.truncate(Self::TOP);
        v
    }
}

/// Everything the kernel side counted.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    pub lost: Losses,
    pub suppressed: Suppressed,
    /// (need, backend) for each need of the syscall side: what
    /// `shmtrace_hooks` exports.
    pub hooks: Vec<(&'static str, &'static str)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_merges_both_budgets_and_keeps_the_largest() {
        let fails = (1..=12u32).map(|p| (p, p as u64));
        let sent = [(3u32, 100u64), (99, 0)];
        let v = Suppressed::top(fails, sent);
        assert_eq!(v.len(), Suppressed::TOP);
        assert_eq!(
            v[0],
            SuppressedBy {
                pid: 3,
                failure_records: 3,
                sent_sigbus: 100
            }
        );
        assert_eq!(v[1].pid, 12);
        assert!(v.iter().all(|s| s.pid != 99 && s.pid != 1));
    }
}
