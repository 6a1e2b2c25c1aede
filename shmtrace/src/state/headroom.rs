//! /dev/shm pages are charged to their writer's memory cgroup: a mount
//! larger than what that cgroup leaves for shared memory can never fill.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    State,
    failures::{ChargedFile, MAX_CHARGED},
    files::FileState,
};
use crate::{
    event::Dev,
    host::{Host, memcg::Memcg},
};

impl State {
    /// `pid`'s memory cgroup as it stands now: where the kernel saw it at
    /// its tmpfs events or failure (it may have exited since), else where
    /// it is.
    pub(super) fn memcg_now(&self, host: &mut dyn Host, pid: u32) -> Option<Memcg> {
        let p = self.procs.get(pid);
        let (version, mut path) = p
            .and_then(|p| p.memcg.clone())
            .or_else(|| p.and_then(|p| host.memcg_path(p.memcg_id)))
            .or_else(|| host.memcg_of(pid))?;
        // A process that already exited shows the root: the cgroup it was
        // seen in while it lived stands in (a victim of the OOM killer is
        // often gone by the time its event is read).
        if path == "/"
            && let Some(c) = p.and_then(|p| p.container.as_ref())
            && c.cgroup != "/"
        {
            path = c.cgroup.clone();
        }
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

impl State {
    /// At an OOM kill of `victim` (header `h`), in memory cgroup `m`: the
    /// tmpfs files the processes under the cgroup that holds the limit
    /// allocated, largest first. Their sizes are measured now, while the
    /// victim still holds its fds.
    pub(super) fn charged_files(
        &mut self,
        host: &mut dyn Host,
        h: &crate::event::Header,
        victim: u32,
        m: Option<&Memcg>,
    ) -> Vec<ChargedFile> {
        self.refresh_files(host);
        // Who counts against the limit: processes whose memory cgroup is at
        // or below the one that holds it; without one, the victim's own.
        let own = self.procs.get(victim).and_then(|p| p.memcg.clone());
        let charged_to = |p: &crate::state::procs::Proc| -> bool {
            if p.pid == victim {
                return true;
            }
            let Some((version, path)) = &p.memcg else {
                return false;
            };
            match m {
                Some(m) if m.limit_bytes.is_some() => *version == m.version && m.covers(path),
                _ => own.as_ref().is_some_and(|(v, o)| v == version && o == path),
            }
        };
        let group: BTreeSet<u32> = self
            .procs
            .all()
            .filter(|p| charged_to(p))
            .map(|p| p.pid)
            .collect();
        // Holders that died with the victim cannot show their files: those
        // still named are measured by name.
        for (key, rel) in self.files.named_of(&group) {
            let Some((ns, m)) = self.mounts.measure_at(key.0) else {
                continue;
            };
            if let found @ crate::host::Lookup::Found(st) =
                host.lookup(key.0, ns, &m.mountpoint, &rel)
                && st.ino == key.1
            {
                self.files.looked_up(key, found);
            }
        }
        self.files.update_bytes();
        let mut v: Vec<ChargedFile> = Vec::new();
        let files: Vec<FileState> = self.files.all().into_iter().cloned().collect();
        for f in files {
            let credited: u64 = f
                .allocated_by
                .iter()
                .filter(|(pid, _)| group.contains(pid))
                .map(|(_, b)| *b)
                .sum();
            let bytes = match f.allocated_bytes {
                0 => credited,
                all => credited.min(all),
            };
            if bytes == 0 {
                continue;
            }
            let path = self.file_path(host, f.dev, f.name.as_deref(), h);
            let mountpoint = self
                .mounts
                .view(f.dev, Some(h.mnt_ns), host.self_ns())
                .map(|x| crate::escape::str(&x.mountpoint));
            let others = f.holders().iter().any(|p| *p != victim);
            v.push(ChargedFile {
                path,
                dev: f.dev,
                ino: f.ino,
                mountpoint,
                bytes,
                unlinked: f.unlinked,
                outlives_victim: !f.unlinked || others,
            });
        }
        v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.ino.cmp(&b.ino)));
        v.truncate(MAX_CHARGED);
        v
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
