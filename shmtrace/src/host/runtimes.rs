//! Container and pod names without an API server, the way node agents and
//! log collectors find them: kubelet's log layout first
//! (`/var/log/containers/<pod>_<namespace>_<container>-<id>.log`,
//! `/var/log/pods/<namespace>_<pod>_<uid>/<container>/`), then the
//! runtime's own state: containerd's OCI bundle and CRI-O's `config.json`
//! (CRI annotations), Podman's `containers.json`, Docker's
//! `config.v2.json`. All are root-owned; files are still opened without
//! following a final symlink, must be regular and are read up to a cap.

use std::{
    io::Read,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use serde_json::Value;

use super::cgroup::{Container, Names};
use crate::escape;

/// A runtime's state file larger than this is not read.
const MAX_STATE_FILE: u64 = 16 << 20;

/// Where the host's directories are (`/` on the node; a fixture in tests).
pub fn names(root: &Path, c: &Container) -> Option<Names> {
    let id = c.container_id.as_deref();
    let mut n = Names::default();
    if let Some(id) = id {
        merge(&mut n, kubelet_container_log(root, id));
    }
    if let Some(uid) = c.pod_uid.as_deref()
        && n.pod_name.is_none()
    {
        merge(&mut n, kubelet_pod_dir(root, uid));
    }
    if let Some(id) = id
        && (n.container.is_none() || (c.pod_uid.is_some() && n.pod_name.is_none()))
    {
        for found in [
            containerd_bundle(root, id),
            crio_config(root, id),
            podman_names(root, id),
            docker_config(root, id),
        ] {
            merge(&mut n, found);
        }
    }
    (n != Names::default()).then_some(n)
}

fn merge(into: &mut Names, from: Option<Names>) {
    let Some(from) = from else { return };
    into.container = into.container.take().or(from.container);
    into.pod_namespace = into.pod_namespace.take().or(from.pod_namespace);
    into.pod_name = into.pod_name.take().or(from.pod_name);
}

fn clean(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| escape::str(s))
}

/// `/var/log/containers/<pod>_<namespace>_<container>-<64 hex id>.log`
/// (names are DNS labels: no `_`).
fn kubelet_container_log(root: &Path, id: &str) -> Option<Names> {
    let suffix = format!("-{id}.log");
    std::fs::read_dir(root.join("var/log/containers"))
        .ok()?
        .flatten()
        .find_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let stem = name.strip_suffix(&suffix)?;
            let mut parts = stem.splitn(3, '_');
            let (pod, ns, ctr) = (parts.next()?, parts.next()?, parts.next()?);
            Some(Names {
                container: clean(ctr),
                pod_namespace: clean(ns),
                pod_name: clean(pod),
            })
        })
}

/// `/var/log/pods/<namespace>_<pod>_<uid>/<container>/`: the pod's names,
/// and the container's when the pod has only one.
fn kubelet_pod_dir(root: &Path, uid: &str) -> Option<Names> {
    let suffix = format!("_{uid}");
    let base = root.join("var/log/pods");
    let dir = std::fs::read_dir(&base)
        .ok()?
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(&suffix))?;
    let name = dir.file_name().into_string().ok()?;
    let (ns, pod) = name.strip_suffix(&suffix)?.split_once('_')?;
    let containers: Vec<String> = std::fs::read_dir(dir.path())
        .ok()?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    Some(Names {
        container: match containers.as_slice() {
            [one] => clean(one),
            _ => None,
        },
        pod_namespace: clean(ns),
        pod_name: clean(pod),
    })
}

/// A root-owned JSON state file, read safely.
fn read_json(path: &Path) -> Option<Value> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_STATE_FILE {
        return None;
    }
    let mut text = String::new();
    f.take(MAX_STATE_FILE).read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
}

fn annotations(v: &Value, keys: [&str; 3]) -> Option<Names> {
    let a = v.get("annotations")?;
    let get = |k: &str| a.get(k).and_then(Value::as_str).and_then(clean);
    let n = Names {
        container: get(keys[0]),
        pod_namespace: get(keys[1]),
        pod_name: get(keys[2]),
    };
    (n != Names::default()).then_some(n)
}

/// containerd: `/run/containerd/io.containerd.runtime.v2.task/<ns>/<id>/config.json`.
fn containerd_bundle(root: &Path, id: &str) -> Option<Names> {
    let tasks = root.join("run/containerd/io.containerd.runtime.v2.task");
    std::fs::read_dir(tasks).ok()?.flatten().find_map(|ns| {
        let v = read_json(&ns.path().join(id).join("config.json"))?;
        annotations(
            &v,
            [
                "io.kubernetes.cri.container-name",
                "io.kubernetes.cri.sandbox-namespace",
                "io.kubernetes.cri.sandbox-name",
            ],
        )
    })
}

fn storage(root: &Path) -> PathBuf {
    root.join("var/lib/containers/storage/overlay-containers")
}

/// CRI-O: `/var/lib/containers/storage/overlay-containers/<id>/userdata/config.json`.
fn crio_config(root: &Path, id: &str) -> Option<Names> {
    let v = read_json(&storage(root).join(id).join("userdata/config.json"))?;
    annotations(
        &v,
        [
            "io.kubernetes.container.name",
            "io.kubernetes.pod.namespace",
            "io.kubernetes.pod.name",
        ],
    )
}

/// Podman: `containers.json` in its storage lists each container's names.
fn podman_names(root: &Path, id: &str) -> Option<Names> {
    let v = read_json(&storage(root).join("containers.json"))?;
    let c = v
        .as_array()?
        .iter()
        .find(|c| c.get("id").and_then(Value::as_str) == Some(id))?;
    let name = c.get("names")?.as_array()?.first()?.as_str()?;
    Some(Names {
        container: clean(name),
        ..Names::default()
    })
}

/// Docker: `/var/lib/docker/containers/<id>/config.v2.json` ("Name": "/x",
/// and CRI labels under dockershim).
fn docker_config(root: &Path, id: &str) -> Option<Names> {
    let v = read_json(
        &root
            .join("var/lib/docker/containers")
            .join(id)
            .join("config.v2.json"),
    )?;
    let labels = v.get("Config").and_then(|c| c.get("Labels"));
    let label = |k: &str| {
        labels
            .and_then(|l| l.get(k))
            .and_then(Value::as_str)
            .and_then(clean)
    };
    Some(Names {
        container: label("io.kubernetes.container.name").or_else(|| {
            v.get("Name")
                .and_then(Value::as_str)
                .and_then(|n| clean(n.trim_start_matches('/')))
        }),
        pod_namespace: label("io.kubernetes.pod.namespace"),
        pod_name: label("io.kubernetes.pod.name"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::cgroup::parse;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "1b2c3d4e-0000-4000-8000-00000000beef";

    fn tree(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("shmtrace-rt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn kubelet_logs_name_the_pod_and_container() {
        let root = tree("kubelet");
        write(
            &root,
            &format!("var/log/containers/trainer-7f9_ml-team_pytorch-{ID}.log"),
            "",
        );
        let mut c = parse(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope",
            UID.replace('-', "_")
        ));
        c.named(names(&root, &c).unwrap());
        let pod = c.pod.as_ref().unwrap();
        assert_eq!(
            (pod.namespace.as_str(), pod.name.as_str(), pod.uid.as_str()),
            ("ml-team", "trainer-7f9", UID)
        );
        assert_eq!(pod.container.name.as_deref(), Some("pytorch"));
        assert_eq!(pod.container.id.as_deref(), Some(ID));
        assert_eq!(c.label(), "pod ml-team/trainer-7f9 / pytorch");
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn pod_directory_then_runtime_state() {
        let root = tree("pods");
        std::fs::create_dir_all(root.join(format!("var/log/pods/ml_job-0_{UID}/worker"))).unwrap();
        let c = parse(&format!("/kubepods/besteffort/pod{UID}/{ID}"));
        let n = names(&root, &c).unwrap();
        assert_eq!(
            (
                n.pod_namespace.as_deref(),
                n.pod_name.as_deref(),
                n.container.as_deref()
            ),
            (Some("ml"), Some("job-0"), Some("worker"))
        );
        // containerd's bundle, when kubelet's logs are not mounted.
        let root2 = tree("containerd");
        write(
            &root2,
            &format!("run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}/config.json"),
            r#"{"annotations":{"io.kubernetes.cri.container-name":"w","io.kubernetes.cri.sandbox-namespace":"ns1","io.kubernetes.cri.sandbox-name":"p1"}}"#,
        );
        let n = names(&root2, &c).unwrap();
        assert_eq!(
            (
                n.pod_namespace.as_deref(),
                n.pod_name.as_deref(),
                n.container.as_deref()
            ),
            (Some("ns1"), Some("p1"), Some("w"))
        );
        let _ = std::fs::remove_dir_all(root);
        let _ = std::fs::remove_dir_all(root2);
    }

    #[test]
    fn podman_and_docker_names_and_hostile_ones_escaped() {
        let root = tree("podman");
        write(
            &root,
            "var/lib/containers/storage/overlay-containers/containers.json",
            &format!(r#"[{{"id":"{ID}","names":["train\u001b[31m"]}}]"#),
        );
        let c = parse(&format!("/libpod_parent/libpod-{ID}"));
        let n = names(&root, &c).unwrap();
        assert_eq!(n.container.as_deref(), Some("train\\x1b[31m"));
        let root2 = tree("docker");
        write(
            &root2,
            &format!("var/lib/docker/containers/{ID}/config.v2.json"),
            r#"{"Name":"/trainer","Config":{"Labels":{}}}"#,
        );
        let c = parse(&format!("/docker/{ID}"));
        assert_eq!(
            names(&root2, &c).unwrap().container.as_deref(),
            Some("trainer")
        );
        // A planted symlink is not followed.
        let root3 = tree("link");
        std::fs::create_dir_all(root3.join(format!("var/lib/docker/containers/{ID}"))).unwrap();
        std::os::unix::fs::symlink(
            root2.join(format!("var/lib/docker/containers/{ID}/config.v2.json")),
            root3.join(format!("var/lib/docker/containers/{ID}/config.v2.json")),
        )
        .unwrap();
        assert_eq!(names(&root3, &c), None);
        for r in [root, root2, root3] {
            let _ = std::fs::remove_dir_all(r);
        }
    }
}
