//! A process's container, from its cgroup path: runtime, container id and,
//! under Kubernetes, the pod UID. Resolved once per cgroup path and cached.

use std::collections::HashMap;

use serde::Serialize;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Container {
    pub cgroup: String,
    /// containerd, cri-o, docker, podman; None outside a container.
    pub runtime: Option<String>,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    /// The container's name as its runtime shows it (Docker, Podman), or
    /// Kubernetes' container name.
    pub name: Option<String>,
    /// Kubernetes identity, Tetragon's shape: from the cgroup path (uid, id)
    /// and kubelet's /var/log/pods layout or the runtime's labels (names).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<Pod>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub container: PodContainer,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PodContainer {
    pub id: Option<String>,
    pub name: Option<String>,
}

/// Names the host found for a container (none of them from the cgroup path).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Names {
    pub container: Option<String>,
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
}

impl Container {
    /// Attaches what the host found: a pod in Tetragon's shape when the
    /// cgroup path had a pod UID and the names are known.
    pub fn named(&mut self, n: Names) {
        self.name = n.container.clone().or(self.name.take());
        if let (Some(uid), Some(ns), Some(name)) = (&self.pod_uid, n.pod_namespace, n.pod_name) {
            self.pod = Some(Pod {
                namespace: ns,
                name,
                uid: uid.clone(),
                container: PodContainer {
                    id: self.container_id.clone(),
                    name: n.container,
                },
            });
        }
    }

    pub fn label(&self) -> String {
        if let Some(p) = &self.pod {
            return format!(
                "pod {}/{} / {}",
                p.namespace,
                p.name,
                p.container.name.as_deref().unwrap_or("?")
            );
        }
        if let (Some(name), Some(rt)) = (&self.name, &self.runtime) {
            return format!("{rt} {name}");
        }
        match (&self.pod_uid, &self.container_id) {
            (Some(pod), Some(id)) => format!("pod {pod} / {}", &id[..id.len().min(12)]),
            (None, Some(id)) => format!(
                "{} {}",
                self.runtime.as_deref().unwrap_or("container"),
                &id[..id.len().min(12)]
            ),
            (Some(pod), None) => format!("pod {pod}"),
            _ => format!("host {}", self.cgroup),
        }
    }
}

/// Parses runtime path shapes (see ../shared/reference/kernel.md):
/// systemd driver `.../kubepods-<qos>-pod<uid_with_underscores>.slice/<rt>-<64hex>.scope`,
/// cgroupfs driver `/kubepods/<qos>/pod<uid>/<64hex>` (or `crio-<64hex>`),
/// Docker `/docker/<id>` or `docker-<id>.scope`, Podman `libpod-<id>.scope`.
pub fn parse(cgroup: &str) -> Container {
    let mut c = Container {
        cgroup: cgroup.to_string(),
        ..Default::default()
    };
    let parts: Vec<&str> = cgroup.split('/').filter(|p| !p.is_empty()).collect();
    for (i, part) in parts.iter().enumerate() {
        // Pod UID.
        if let Some(rest) = part.strip_prefix("pod").filter(|r| is_uid(r)) {
            c.pod_uid = Some(rest.to_string());
        } else if let Some(idx) = part.find("-pod")
            && part.ends_with(".slice")
        {
            let uid = part[idx + 4..part.len() - 6].replace('_', "-");
            if is_uid(&uid) {
                c.pod_uid = Some(uid);
            }
        }
        // Container id and runtime.
        let scope = part.strip_suffix(".scope").unwrap_or(part);
        for (prefix, runtime) in [
            ("cri-containerd-", "containerd"),
            ("crio-", "cri-o"),
            ("docker-", "docker"),
            ("libpod-", "podman"),
        ] {
            if let Some(id) = scope.strip_prefix(prefix).filter(|id| is_hex64(id)) {
                c.container_id = Some(id.to_string());
                c.runtime = Some(runtime.to_string());
            }
        }
        if c.container_id.is_none() && is_hex64(part) {
            c.container_id = Some(part.to_string());
            let parent = if i > 0 { parts[i - 1] } else { "" };
            c.runtime = Some(
                if parts.first() == Some(&"docker") || parent == "docker" {
                    "docker"
                } else {
                    // cgroupfs driver: containerd or docker; the path does not say which.
                    "containerd"
                }
                .to_string(),
            );
        }
    }
    c
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_uid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
        && s.matches('-').count() == 4
}

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
