//! A process's container, from its cgroup path: runtime, container id and,
//! under Kubernetes, the pod UID. Resolved once per cgroup path and cached.

use std::collections::HashMap;

pub use crate::host::cgroup::{Container, Names, Pod, PodContainer, parse};

/// Containers by cgroup path, and which path each process and cgroup id
/// has. Paths come from the host; this only remembers and parses them.
#[derive(Default)]
pub struct Containers {
    by_path: HashMap<String, Container>,
    by_pid: HashMap<u32, String>,
    /// cgroup v2 id (what bpf_get_current_cgroup_id returns) -> path.
    by_id: HashMap<u64, String>,
    /// Containers whose names were looked for, and how many times (a
    /// starting pod's log directory may appear a little later).
    name_tries: HashMap<String, u8>,
}

/// Looks for a container's names this many times (once a tick) at most.
pub const NAME_TRIES: u8 = 10;

/// cgroup ids and paths cached: a cache, so bounded by clearing (what is
/// still needed is learned again).
pub const MAX_CACHED: usize = 4096;

impl Containers {
    fn trim(&mut self) {
        if self.by_id.len() > MAX_CACHED {
            self.by_id.clear();
        }
        if self.by_path.len() > MAX_CACHED {
            let live: std::collections::HashSet<String> = self.by_pid.values().cloned().collect();
            self.by_path.retain(|p, _| live.contains(p));
            self.name_tries.retain(|p, _| live.contains(p));
        }
    }

    fn intern(&mut self, path: &str) -> &Container {
        self.trim();
        self.by_path
            .entry(path.to_string())
            .or_insert_with(|| parse(path))
    }

    /// Containers to look up names for now: in a container, not named
    /// yet, tried fewer than [`NAME_TRIES`] times.
    pub fn unnamed(&self) -> Vec<Container> {
        self.by_path
            .values()
            .filter(|c| c.container_id.is_some() && c.name.is_none() && c.pod.is_none())
            .filter(|c| self.name_tries.get(&c.cgroup).copied().unwrap_or(0) < NAME_TRIES)
            .cloned()
            .collect()
    }

    /// The host looked for `cgroup`'s names and found these (or nothing).
    pub fn looked_up(&mut self, cgroup: &str, names: Option<Names>) {
        *self.name_tries.entry(cgroup.to_string()).or_default() += 1;
        if let (Some(n), Some(c)) = (names, self.by_path.get_mut(cgroup)) {
            c.named(n);
        }
    }

    /// The container at cgroup path `cgroup`, as known now (names included).
    pub fn by_cgroup(&self, cgroup: &str) -> Option<&Container> {
        self.by_path.get(cgroup)
    }

    pub fn knows_id(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
    }

    pub fn knows_pid(&self, pid: u32) -> bool {
        self.by_pid.contains_key(&pid)
    }

    /// cgroup id `id` is at `path`.
    pub fn learn_id(&mut self, id: u64, path: String) {
        self.intern(&path);
        self.by_id.insert(id, path);
    }

    /// Process `pid` is in cgroup `path`.
    pub fn learn_pid(&mut self, pid: u32, path: String) {
        self.intern(&path);
        self.by_pid.insert(pid, path);
    }

    /// The container of cgroup v2 id `id`, as the eBPF programs saw it at
    /// the event (right even for a process that is gone since).
    pub fn of_id(&self, id: u64) -> Option<&Container> {
        if id <= 1 {
            return None; // the root: a v1 or hybrid host says nothing here
        }
        self.by_path.get(self.by_id.get(&id)?)
    }

    /// Seeds a child with its parent's cgroup until /proc says otherwise.
    pub fn inherit(&mut self, parent: u32, child: u32) {
        if let Some(p) = self.by_pid.get(&parent).cloned() {
            self.by_pid.insert(child, p);
        }
    }

    pub fn forget(&mut self, pid: u32) {
        self.by_pid.remove(&pid);
    }

    pub fn get(&self, pid: u32) -> Option<&Container> {
        self.by_path.get(self.by_pid.get(&pid)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "12345678-9abc-def0-1234-56789abcdef0";

    #[test]
    fn kubernetes_systemd_driver() {
        let c = parse(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope",
            UID.replace('-', "_")
        ));
        assert_eq!(c.pod_uid.as_deref(), Some(UID));
        assert_eq!(c.container_id.as_deref(), Some(ID));
        assert_eq!(c.runtime.as_deref(), Some("containerd"));
        let c = parse(&format!(
            "/kubepods.slice/kubepods-pod{}.slice/crio-{ID}.scope",
            UID.replace('-', "_")
        ));
        assert_eq!(
            (c.pod_uid.as_deref(), c.runtime.as_deref()),
            (Some(UID), Some("cri-o"))
        );
    }

    #[test]
    fn kubernetes_cgroupfs_driver_and_docker() {
        let c = parse(&format!("/kubepods/burstable/pod{UID}/{ID}"));
        assert_eq!(
            (c.pod_uid.as_deref(), c.container_id.as_deref()),
            (Some(UID), Some(ID))
        );
        let c = parse(&format!("/kubepods/besteffort/pod{UID}/crio-{ID}"));
        assert_eq!(c.runtime.as_deref(), Some("cri-o"));
        let c = parse(&format!("/docker/{ID}"));
        assert_eq!(
            (c.runtime.as_deref(), c.pod_uid.as_deref()),
            (Some("docker"), None)
        );
        let c = parse(&format!("/system.slice/docker-{ID}.scope"));
        assert_eq!(c.container_id.as_deref(), Some(ID));
        let c = parse(&format!("/machine.slice/libpod-{ID}.scope"));
        assert_eq!(c.runtime.as_deref(), Some("podman"));
        let c = parse("/user.slice/user-1000.slice/session-2.scope");
        assert_eq!(
            c,
            Container {
                cgroup: c.cgroup.clone(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn cache_by_id_and_pid() {
        let mut cs = Containers::default();
        cs.learn_id(77, format!("/docker/{ID}"));
        cs.learn_pid(10, format!("/kubepods/burstable/pod{UID}/{ID}"));
        cs.inherit(10, 11);
        assert_eq!(cs.of_id(77).unwrap().runtime.as_deref(), Some("docker"));
        assert!(cs.of_id(1).is_none(), "the root cgroup names no container");
        assert_eq!(cs.get(11).unwrap().pod_uid.as_deref(), Some(UID));
        cs.forget(11);
        assert!(cs.get(11).is_none());
        assert!(cs.knows_pid(10) && cs.knows_id(77));
    }
}
