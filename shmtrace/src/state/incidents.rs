//! Incidents: node-wide, each tmpfs mount that fails is its own story (one
//! pod's /dev/shm filling is not collateral of another's). A failure on a
//! mount with no open incident opens one; later failures there join it; an
//! incident closes after a quiet period, and a failure after that opens a
//! new one. Failures with no mount (an OOM kill) are grouped by the failing
//! process's mount namespace.

use std::collections::VecDeque;

use serde::Serialize;

use crate::event::Dev;

/// Incidents kept; the oldest closed ones go first (counted).
pub const MAX_INCIDENTS: usize = 256;

/// What an incident is about: a tmpfs device when the failure has one (a
/// tmpfs device is unique on the node), else a mount namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Place {
    Mount(Dev),
    Namespace(u32),
}

#[derive(Clone, Debug, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Incident {
    /// 1, 2, ... in the order they opened.
    pub id: u64,
    #[serde(skip)]
    pub place: Place,
    /// The mount namespace of its first failing process.
    pub mnt_ns: u32,
    /// Kernel time (CLOCK_MONOTONIC) of its first and last failure.
    pub first_ns: u64,
    pub last_ns: u64,
    /// Failures in it, repeats included.
    pub failures: u64,
    /// When it closed (kernel time), after `quiet` without a failure.
    pub closed_ns: Option<u64>,
}

impl Incident {
    pub fn is_open(&self) -> bool {
        self.closed_ns.is_none()
    }
}

#[derive(Default)]
pub struct Incidents {
    list: VecDeque<Incident>,
    next_id: u64,
    /// Closed incidents let go over the cap.
    dropped: u64,
}

impl Incidents {
    /// Incidents let go over the cap.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// A failure at `ts_ns` on `place`: joins the open incident there or
    /// opens one. Returns the incident's id and whether it was opened now
    /// (then the failure is its first, and gathers the evidence).
    pub fn failed(&mut self, place: Place, mnt_ns: u32, ts_ns: u64) -> (u64, bool) {
        if let Some(i) = self
            .list
            .iter_mut()
            .rev()
            .find(|i| i.place == place && i.is_open())
        {
            i.failures += 1;
            i.last_ns = i.last_ns.max(ts_ns);
            return (i.id, false);
        }
        self.next_id += 1;
        self.list.push_back(Incident {
            id: self.next_id,
            place,
            mnt_ns,
            first_ns: ts_ns,
            last_ns: ts_ns,
            failures: 1,
            closed_ns: None,
        });
        self.trim();
        (self.next_id, true)
    }

    /// Closes the open incidents with no failure for `quiet_ns` before
    /// `now_ns`; returns their ids.
    pub fn close_quiet(&mut self, now_ns: u64, quiet_ns: u64) -> Vec<u64> {
        let mut closed = Vec::new();
        for i in self.list.iter_mut().filter(|i| i.is_open()) {
            if now_ns.saturating_sub(i.last_ns) >= quiet_ns {
                i.closed_ns = Some(now_ns);
                closed.push(i.id);
            }
        }
        closed
    }

    /// Closes every open incident (shmtrace is ending).
    pub fn close_all(&mut self, now_ns: u64) -> Vec<u64> {
        self.close_quiet(now_ns, 0)
    }

    fn trim(&mut self) {
        while self.list.len() > MAX_INCIDENTS {
            match self.list.iter().position(|i| !i.is_open()) {
                Some(pos) => {
                    self.list.remove(pos);
                    self.dropped += 1;
                }
                None => break,
            }
        }
    }

    /// In the order they opened (the order of their first failures).
    pub fn all(&self) -> impl Iterator<Item = &Incident> {
        self.list.iter()
    }

    pub fn get(&self, id: u64) -> Option<&Incident> {
        self.list.iter().find(|i| i.id == id)
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn each_mount_has_its_own_incident_and_a_quiet_period_closes_it() {
        let mut t = Incidents::default();
        let (a, b) = (Place::Mount(Dev::new(0, 40)), Place::Mount(Dev::new(0, 41)));
        // Pod A's /dev/shm fails, pod B's three seconds later: two stories.
        assert_eq!(t.failed(a, 7, 10 * S), (1, true));
        assert_eq!(t.failed(a, 7, 11 * S), (1, false));
        assert_eq!(t.failed(b, 8, 13 * S), (2, true));
        assert!(t.close_quiet(20 * S, 30 * S).is_empty());
        // Quiet for 30 s: A closes at 41 s, B stays open until 43 s.
        assert_eq!(t.close_quiet(41 * S, 30 * S), vec![1]);
        assert!(t.get(2).unwrap().is_open());
        // A fails again: a new incident, not the old one reopened.
        assert_eq!(t.failed(a, 7, 50 * S), (3, true));
        assert_eq!(t.get(1).unwrap().failures, 2);
        assert_eq!(t.close_all(60 * S), vec![2, 3]);
    }

    #[test]
    fn closed_incidents_go_first_over_the_cap() {
        let mut t = Incidents::default();
        for n in 0..MAX_INCIDENTS as u32 + 10 {
            t.failed(Place::Namespace(n), n, u64::from(n));
            if n % 2 == 0 {
                t.close_all(u64::from(n));
            }
        }
        assert_eq!(t.len(), MAX_INCIDENTS);
        assert_eq!(t.dropped, 10);
        assert!(t.all().next().unwrap().id > 1);
    }
}
