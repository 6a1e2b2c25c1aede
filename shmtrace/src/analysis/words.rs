//! The diagnosis's words for sizes, pids and fixes: how a runtime, a pod
//! spec or a log spells them.

use crate::state::containers::Container;

use crate::units::MIB;

/// The size in the words of the runtime that made this container.
pub fn runtime_fix(c: &Container, mib: u64) -> Option<String> {
    let name = c.name.clone().or_else(|| {
        c.container_id
            .as_deref()
            .map(|i| i[..i.len().min(12)].to_string())
    })?;
    if c.pod_uid.is_some() {
        let pod = c
            .pod
            .as_ref()
            .map(|p| format!("pod {}/{}", p.namespace, p.name))
            .unwrap_or_else(|| "the pod".into());
        return Some(format!(
            "{pod}: mount a Memory emptyDir of {mib}Mi at /dev/shm (see kubernetes)"
        ));
    }
    match c.runtime.as_deref()? {
        rt @ ("podman" | "docker") => Some(format!(
            "{rt} run --shm-size={mib}m ... (for container {name})"
        )),
        _ => None,
    }
}

/// "pid 9, python, host pid 31613" in a container, "pid 31613, python" on
/// the host: the pid the process's own logs print comes first.
pub fn shown_pid(pid: u32, ns_pid: Option<u32>, comm: &str) -> String {
    match ns_pid {
        Some(n) if n != pid => format!("pid {n}, {comm}, host pid {pid}"),
        _ => format!("pid {pid}, {comm}"),
    }
}

pub fn human_mib(b: u64) -> String {
    format!("{} MiB", b.div_ceil(MIB))
}

pub fn kubernetes_snippet(mib: u64) -> String {
    format!(
        "volumes:\n  - name: dshm\n    emptyDir:\n      medium: Memory\n      sizeLimit: {mib}Mi\ncontainers:\n  - volumeMounts:\n      - name: dshm\n        mountPath: /dev/shm"
    )
}
