//! Who removed which shared-memory file, and when: the answer when another
//! process then finds a segment gone (`shm_open` → "No such file or
//! directory"), which the framework reports without saying who removed it.

use std::collections::{HashMap, VecDeque};

use serde::Serialize;

use crate::event::Dev;

/// Removals remembered at most (the oldest are forgotten first).
pub const MAX_REMOVALS: usize = 4096;

/// One unlink of a tmpfs file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Removal {
    /// The process that removed it.
    pub pid: u32,
    /// That process's parent.
    pub ppid: u32,
    /// That process's name.
    pub comm: String,
    /// When, kernel monotonic nanoseconds.
    pub ts_ns: u64,
    /// The path as the remover passed it (escaped).
    pub path: String,
    /// The remover's container (runtime:id), when it was in one.
    pub container: Option<String>,
}

/// Where a removed file lived: its mount's device and its name under the
/// mount, or, when the mount could not be found, the remover's namespace
/// and the path as given.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Where {
    Mount(Dev, String),
    Path(u32, String),
}

#[derive(Default)]
pub struct Removals {
    latest: HashMap<Where, Removal>,
    /// Insertion order, for forgetting the oldest.
    order: VecDeque<Where>,
    /// Removals seen in all (not only those kept).
    seen: u64,
}

impl Removals {
    pub fn removed(&mut self, at: Where, r: Removal) {
        self.seen += 1;
        if self.latest.insert(at.clone(), r).is_some() {
            // Already queued: its slot in the order stays where it was
            // (a name reused a lot is forgotten no later than others).
            return;
        }
        self.order.push_back(at);
        while self.order.len() > MAX_REMOVALS {
            if let Some(old) = self.order.pop_front() {
                self.latest.remove(&old);
            }
        }
    }

    /// The last removal of the file at `at` before `ts_ns`.
    pub fn removal_of(&self, at: &Where, ts_ns: u64) -> Option<&Removal> {
        self.latest.get(at).filter(|r| r.ts_ns <= ts_ns)
    }

    pub fn len(&self) -> usize {
        self.latest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.latest.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(pid: u32, ts_ns: u64) -> Removal {
        Removal {
            pid,
            ppid: 1,
            comm: "rm".into(),
            ts_ns,
            path: "/dev/shm/x".into(),
            container: None,
        }
    }

    #[test]
    fn the_last_removal_before_the_open_answers() {
        let mut rs = Removals::default();
        let at = Where::Mount(Dev::new(0, 40), "torch_1_2_3".into());
        rs.removed(at.clone(), r(10, 100));
        assert_eq!(rs.removal_of(&at, 150).unwrap().pid, 10);
        rs.removed(at.clone(), r(11, 200));
        assert_eq!(rs.removal_of(&at, 250).unwrap().pid, 11);
        // A removal after the open cannot explain it.
        assert!(rs.removal_of(&at, 150).is_none());
        let other = Where::Mount(Dev::new(0, 41), "torch_1_2_3".into());
        assert!(rs.removal_of(&other, 250).is_none());
        assert_eq!(rs.seen, 2);
        assert_eq!(rs.len(), 1);
    }

    #[test]
    fn memory_is_bounded_and_the_oldest_go_first() {
        let mut rs = Removals::default();
        for i in 0..(MAX_REMOVALS as u64 + 10) {
            rs.removed(Where::Path(1, format!("/dev/shm/f{i}")), r(i as u32, i));
        }
        assert_eq!(rs.len(), MAX_REMOVALS);
        assert!(
            rs.removal_of(&Where::Path(1, "/dev/shm/f0".into()), u64::MAX)
                .is_none()
        );
        let last = format!("/dev/shm/f{}", MAX_REMOVALS + 9);
        assert!(rs.removal_of(&Where::Path(1, last), u64::MAX).is_some());
        assert_eq!(rs.seen, MAX_REMOVALS as u64 + 10);
    }
}
