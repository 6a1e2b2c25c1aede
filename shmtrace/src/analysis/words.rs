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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::cgroup::parse;

    const ID: &str = "5b2b5b90953c90fc9de7c420aaac9d4c208fa293c428f1811f3d8e14c48b03ed";

    #[test]
    fn the_fix_is_spelled_in_the_runtime_that_made_the_container() {
        let mut c = parse(&format!("/docker/{ID}"));
        assert_eq!(
            runtime_fix(&c, 128).as_deref(),
            Some("docker run --shm-size=128m ... (for container 5b2b5b90953c)")
        );
        c.name = Some("train".into());
        assert!(
            runtime_fix(&c, 128)
                .unwrap()
                .ends_with("(for container train)")
        );
        let pod = parse(&format!(
            "/kubepods/burstable/pod0f3c2a1e-1111-2222-3333-444455556666/{ID}"
        ));
        assert_eq!(
            runtime_fix(&pod, 256).as_deref(),
            Some("the pod: mount a Memory emptyDir of 256Mi at /dev/shm (see kubernetes)")
        );
        // containerd without kubelet, and the host: no runtime flag to give.
        assert_eq!(
            runtime_fix(&parse(&format!("/system.slice/{ID}")), 64),
            None
        );
        assert_eq!(runtime_fix(&parse("/user.slice"), 64), None);
    }

    #[test]
    fn pids_come_as_the_process_sees_them_first() {
        assert_eq!(
            shown_pid(31613, Some(9), "python"),
            "pid 9, python, host pid 31613"
        );
        assert_eq!(shown_pid(31613, Some(31613), "python"), "pid 31613, python");
        assert_eq!(shown_pid(5, None, "dd"), "pid 5, dd");
    }

    #[test]
    fn sizes_round_up_to_whole_mebibytes_and_fit_a_pod_spec() {
        assert_eq!(human_mib(MIB + 1), "2 MiB");
        assert_eq!(human_mib(64 * MIB), "64 MiB");
        let k = kubernetes_snippet(192);
        assert!(k.contains("medium: Memory") && k.contains("sizeLimit: 192Mi"));
        assert!(k.contains("mountPath: /dev/shm"));
    }
}
