//! /dev/shm pages are charged to their writer's memory cgroup: a mount
//! larger than what that cgroup leaves for shared memory can never fill.

use std::collections::BTreeMap;

use super::State;
use crate::{
    event::Dev,
    host::{Host, memcg::Memcg},
    units::human_bytes,
};

impl State {
    /// `pid`'s memory cgroup as it stands now: where it was when it created
    /// a tmpfs file (it may have exited since), else where it is.
    pub(super) fn memcg_now(&self, host: &mut dyn Host, pid: u32) -> Option<Memcg> {
        let (version, path) = self
            .procs
            .get(pid)
            .and_then(|p| p.memcg.clone())
            .or_else(|| host.memcg_of(pid))?;
        host.memcg_at(version, &path)
    }

    /// The tightest memory cgroup among the processes that allocated pages
    /// of files on `dev`: (it, the room it leaves for shared memory).
    pub(super) fn memory_headroom(
        &self,
        host: &mut dyn Host,
        dev: Dev,
        reads: &mut BTreeMap<(u8, String), Option<Memcg>>,
    ) -> Option<(Memcg, u64)> {
        let mut writers: Vec<u32> = self
            .files
            .files
            .values()
            .filter(|f| f.kdev == dev && f.allocated_bytes > 0)
            .flat_map(|f| {
                f.allocated_by
                    .iter()
                    .filter(|(_, b)| **b > 0)
                    .map(|(p, _)| *p)
            })
            .collect();
        writers.sort_unstable();
        writers.dedup();
        let mut best: Option<(Memcg, u64)> = None;
        for pid in writers {
            // An exited writer's cgroup still counts while it exists (its
            // pages stay charged there); a removed one reads as nothing.
            let Some(at) = self.procs.get(pid).and_then(|p| p.memcg.clone()) else {
                continue;
            };
            if !reads.contains_key(&at) {
                if reads.len() >= 32 {
                    continue;
                }
                let m = host.memcg_at(at.0, &at.1);
                reads.insert(at.clone(), m);
            }
            let Some(m) = reads.get(&at).cloned().flatten() else {
                continue;
            };
            let Some(limit) = m.limit_bytes else {
                continue;
            };
            // What the cgroup leaves for shared memory: its limit less what
            // its processes use besides it.
            let room =
                limit.saturating_sub(m.usage_bytes.saturating_sub(m.shmem_bytes.unwrap_or(0)));
            if best.as_ref().is_none_or(|(_, r)| room < *r) {
                best = Some((m, room));
            }
        }
        best
    }
}

/// A mount its writers' memory cgroup cannot fill, in words.
pub(super) fn headroom_words(
    mountpoint: &Option<String>,
    size: u64,
    m: &Memcg,
    room: u64,
) -> String {
    format!(
        "{} is {} but its writers' memory cgroup {} allows {} ({} in use, {} of it shmem) and leaves about {} for shared memory: it can never fill; the OOM killer strikes first. Raise the memory limit, or size /dev/shm below {} (Kubernetes sizes a Memory emptyDir at min(sizeLimit, the pod's memory limit) since 1.32; before that, sizeLimit alone)",
        mountpoint.as_deref().unwrap_or("the mount"),
        human_bytes(size),
        m.path,
        human_bytes(m.limit_bytes.unwrap_or(0)),
        human_bytes(m.usage_bytes),
        human_bytes(m.shmem_bytes.unwrap_or(0)),
        human_bytes(room),
        human_bytes(room)
    )
}
