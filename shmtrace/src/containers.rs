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
}

impl Container {
    pub fn label(&self) -> String {
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

/// The cgroup path that names the process's container: the v2 line
/// ("0::/...") when it says more than "/", else the v1 memory controller's
/// (hybrid hosts), else the first non-root one.
pub fn cgroup_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mut v2 = None;
    let mut memory = None;
    let mut any = None;
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if ctrl.is_empty() {
            v2 = Some(path.to_string());
        } else if ctrl.split(',').any(|c| c == "memory") {
            memory = Some(path.to_string());
        } else if path != "/" && any.is_none() {
            any = Some(path.to_string());
        }
    }
    match v2 {
        Some(p) if p != "/" => Some(p),
        _ => memory.filter(|p| p != "/").or(any).or(Some("/".into())),
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

/// Cache: cgroup path -> parsed container.
#[derive(Default)]
pub struct Containers {
    by_path: HashMap<String, Container>,
    by_pid: HashMap<u32, String>,
    /// cgroup v2 id (the directory's inode, what bpf_get_current_cgroup_id
    /// returns) -> path, from one walk of the v2 hierarchy, redone on a miss
    /// at most once a second.
    by_id: HashMap<u64, String>,
    last_walk: Option<std::time::Instant>,
}

/// Where the cgroup v2 hierarchy is mounted (unified on hybrid hosts).
fn v2_root() -> Option<&'static str> {
    let has = |dir: &str, file: &str| std::path::Path::new(dir).join(file).exists();
    if has("/sys/fs/cgroup/unified", "cgroup.procs") {
        Some("/sys/fs/cgroup/unified")
    } else if has("/sys/fs/cgroup", "cgroup.controllers") {
        Some("/sys/fs/cgroup")
    } else {
        None
    }
}

fn walk(
    root: &std::path::Path,
    dir: &std::path::Path,
    out: &mut HashMap<u64, String>,
    depth: usize,
) {
    use std::os::unix::fs::MetadataExt;
    if depth > 16 {
        return;
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir())
            && let Ok(md) = e.metadata()
        {
            let rel = e
                .path()
                .strip_prefix(root)
                .map(|r| format!("/{}", r.display()))
                .unwrap_or_default();
            out.insert(md.ino(), rel);
            walk(root, &e.path(), out, depth + 1);
        }
    }
}

impl Containers {
    /// The container of cgroup v2 id `id`, as the eBPF programs saw it at
    /// the event (right even for a process that is gone since).
    pub fn of_id(&mut self, id: u64) -> Option<&Container> {
        if id <= 1 {
            return None; // the root: a v1 or hybrid host says nothing here
        }
        if !self.by_id.contains_key(&id)
            && self.last_walk.is_none_or(|t| t.elapsed().as_secs() >= 1)
        {
            self.last_walk = Some(std::time::Instant::now());
            if let Some(root) = v2_root() {
                let root = std::path::Path::new(root);
                walk(root, root, &mut self.by_id, 0);
            }
        }
        let path = self.by_id.get(&id)?.clone();
        Some(
            self.by_path
                .entry(path.clone())
                .or_insert_with(|| parse(&path)),
        )
    }

    /// The container of `pid`, read from /proc the first time (retried on
    /// later calls while /proc cannot tell).
    pub fn of(&mut self, pid: u32) -> Option<&Container> {
        if !self.by_pid.contains_key(&pid) {
            let path = cgroup_of(pid)?;
            self.by_path
                .entry(path.clone())
                .or_insert_with(|| parse(&path));
            self.by_pid.insert(pid, path);
        }
        self.by_path.get(self.by_pid.get(&pid)?)
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
}
