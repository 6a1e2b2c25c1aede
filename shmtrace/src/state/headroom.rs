//! /dev/shm pages are charged to their writer's memory cgroup: a mount
//! larger than what that cgroup leaves for shared memory can never fill.

use std::collections::BTreeMap;

use super::State;
use crate::{
    event::Dev,
    host::{Host, memcg::Memcg},
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
            .on(dev)
            .filter(|f| f.allocated_bytes > 0)
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
            let Some(m) = memcg_cached(host, reads, at.0, at.1) else {
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

/// Memory cgroups read once a tick, at most [`MAX_MEMCG_READS`] of them:
/// a cgroup past the cap reads as unknown until the next tick.
pub(super) fn memcg_cached(
    host: &mut dyn Host,
    reads: &mut BTreeMap<(u8, String), Option<Memcg>>,
    version: u8,
    path: String,
) -> Option<Memcg> {
    let key = (version, path);
    if !reads.contains_key(&key) {
        if reads.len() >= MAX_MEMCG_READS {
            return None;
        }
        let m = host.memcg_at(version, &key.1);
        reads.insert(key.clone(), m);
    }
    reads.get(&key).cloned().flatten()
}

/// Memory cgroups read at most per tick (each a few small reads).
const MAX_MEMCG_READS: usize = 32;

/// The pod-level cgroup of a Kubernetes container's cgroup path: the path
/// down to its `pod<uid>` part (cgroupfs `/kubepods/burstable/pod<uid>/<id>`,
/// systemd `/kubepods.slice/.../kubepods-burstable-pod<uid>.slice/...`).
pub fn pod_cgroup(path: &str) -> Option<String> {
    if !path.starts_with("/kubepods") {
        return None;
    }
    let mut out = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        out.push('/');
        out.push_str(part);
        if part.starts_with("pod") || part.contains("-pod") {
            return (out != path).then_some(out);
        }
    }
    None
}

/// A mount its writers' memory cgroup cannot fill: the facts the warning
/// is worded from (`analysis::causes::headroom`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Headroom {
    /// The mount's size.
    pub size: u64,
    /// What the cgroup leaves for shared memory.
    pub room: u64,
    pub memcg: Memcg,
    /// The writers' pod's memory limit, when they run in one.
    pub pod_limit: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_cgroups_of_both_drivers() {
        assert_eq!(
            pod_cgroup("/kubepods/burstable/pod1234-ab/0123abcd").as_deref(),
            Some("/kubepods/burstable/pod1234-ab")
        );
        assert_eq!(
            pod_cgroup("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_ab.slice/cri-containerd-0123.scope").as_deref(),
            Some("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_ab.slice")
        );
        assert_eq!(
            pod_cgroup("/kubepods/pod9/ctr").as_deref(),
            Some("/kubepods/pod9")
        );
        assert_eq!(pod_cgroup("/user.slice/pod1/x"), None);
        // The pod's own cgroup is no container's.
        assert_eq!(pod_cgroup("/kubepods/pod9"), None);
    }
}
