//! A container as its cgroup path names it (runtime, container id and,
//! under Kubernetes, the pod UID), and the names the host finds for it.

use serde::Serialize;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Container {
    /// The cgroup path (v2, or the v1 memory hierarchy's).
    pub cgroup: String,
    /// containerd, cri-o, docker, podman; None outside a container.
    pub runtime: Option<String>,
    /// The runtime's 64-hex container id, when the path has one.
    pub container_id: Option<String>,
    /// The Kubernetes pod UID (dashes), when the path has one.
    pub pod_uid: Option<String>,
    /// The container's name as its runtime shows it (Docker, Podman), or
    /// Kubernetes' container name.
    pub name: Option<String>,
    /// Kubernetes identity, Tetragon's shape: from the cgroup path (uid, id)
    /// and kubelet's /var/log/pods layout or the runtime's labels (names).
    pub pod: Option<Pod>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Pod {
    /// The pod's Kubernetes namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
    pub container: PodContainer,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct PodContainer {
    /// The container id.
    pub id: Option<String>,
    /// The container's name in the pod spec.
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

    /// A container or pod, not just a cgroup of the host (a systemd unit,
    /// a session's own cgroup).
    pub fn is_container(&self) -> bool {
        self.runtime.is_some() || self.container_id.is_some() || self.pod_uid.is_some()
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

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "5b2b5b90953c90fc9de7c420aaac9d4c208fa293c428f1811f3d8e14c48b03ed";
    const UID: &str = "0f3c2a1e-1111-2222-3333-444455556666";

    #[test]
    fn labels_say_pod_runtime_name_or_short_id() {
        let c = parse(&format!("/libpod_parent/libpod-{ID}"));
        assert_eq!(c.label(), "podman 5b2b5b90953c");
        let mut named = c.clone();
        named.named(Names {
            container: Some("trainer".into()),
            ..Default::default()
        });
        assert_eq!(named.label(), "podman trainer");
        let pod = parse(&format!("/kubepods/burstable/pod{UID}/{ID}"));
        assert_eq!(pod.label(), format!("pod {UID} / 5b2b5b90953c"));
        assert_eq!(
            parse("/user.slice/session-3.scope").label(),
            "host /user.slice/session-3.scope"
        );
    }

    #[test]
    fn a_pod_is_named_only_with_its_uid_and_both_names() {
        let mut c = parse(&format!("/kubepods/burstable/pod{UID}/{ID}"));
        c.named(Names {
            container: Some("worker".into()),
            pod_namespace: Some("ml".into()),
            pod_name: None,
        });
        assert!(c.pod.is_none(), "no pod name: no pod");
        c.named(Names {
            container: Some("worker".into()),
            pod_namespace: Some("ml".into()),
            pod_name: Some("train-0".into()),
        });
        let p = c.pod.as_ref().unwrap();
        assert_eq!(
            (p.namespace.as_str(), p.name.as_str(), p.uid.as_str()),
            ("ml", "train-0", UID)
        );
        assert_eq!(p.container.id.as_deref(), Some(ID));
        assert_eq!(c.label(), "pod ml/train-0 / worker");
    }

    #[test]
    fn systemd_slices_give_the_uid_back_its_dashes() {
        let c = parse(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope",
            UID.replace('-', "_")
        ));
        assert_eq!(c.pod_uid.as_deref(), Some(UID));
        assert_eq!(
            (c.runtime.as_deref(), c.container_id.as_deref()),
            (Some("containerd"), Some(ID))
        );
        // Not a uid, not a container.
        let c = parse("/kubepods/podnotauid/abc");
        assert_eq!((c.pod_uid, c.container_id), (None, None));
    }
}
