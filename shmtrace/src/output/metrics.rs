//! Prometheus metrics for the DaemonSet (`--metrics ADDR`): /dev/shm size,
//! use and peak per mount, bytes held per container, failures and losses.
//! Labels follow the Prometheus naming guide: no pid as a label. Rendered
//! with prometheus-client (OpenMetrics text, its escaping) from the state
//! at the moment of a scrape; `serve` answers the HTTP side.

use std::collections::{BTreeMap, BTreeSet};

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::{
    capture::Counters,
    state::{State, containers::Container},
};

/// Pod namespace, pod name and container name for a container id, from the
/// kubelet's /var/log/containers/<pod>_<namespace>_<container>-<id>.log
/// links (no API server needed). Re-read on a miss at most every 30 s.
#[derive(Default)]
pub struct PodNames {
    by_id: BTreeMap<String, (String, String, String)>,
    last_read: Option<std::time::Instant>,
}

pub const KUBELET_LOGS: &str = "/var/log/containers";

impl PodNames {
    pub fn lookup(&mut self, id: &str) -> Option<&(String, String, String)> {
        if !self.by_id.contains_key(id)
            && self.last_read.is_none_or(|t| t.elapsed().as_secs() >= 30)
        {
            self.last_read = Some(std::time::Instant::now());
            self.by_id = read_kubelet_logs(std::path::Path::new(KUBELET_LOGS));
        }
        self.by_id.get(id)
    }
}

fn read_kubelet_logs(dir: &std::path::Path) -> BTreeMap<String, (String, String, String)> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".log") else {
            continue;
        };
        // <pod>_<namespace>_<container>-<64 hex>
        let Some((rest, id)) = stem.rsplit_once('-') else {
            continue;
        };
        let mut parts = rest.splitn(3, '_');
        if let (Some(pod), Some(ns), Some(container)) = (parts.next(), parts.next(), parts.next()) {
            out.insert(
                id.to_string(),
                (ns.to_string(), pod.to_string(), container.to_string()),
            );
        }
    }
    out
}

/// Who a series is about: names when the kubelet's logs tell them, else
/// the pod UID and a short container id; empty for the host.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Pod {
    namespace: String,
    pod: String,
    container: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MountLabels {
    mountpoint: String,
    dev: String,
    #[prometheus(flatten)]
    pod: Pod,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    /// The cause (tmpfs_full, address_space_limit, ...).
    reason: String,
    /// sigbus, enospc, mmap_error, oom_kill, ...
    kind: String,
    #[prometheus(flatten)]
    pod: Pod,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Stage {
    stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Version {
    version: String,
}

fn pod(c: Option<&Container>, names: &mut PodNames) -> Pod {
    let Some(c) = c else {
        return Pod::default();
    };
    if let Some(id) = &c.container_id
        && let Some((namespace, pod, container)) = names.lookup(id).cloned()
    {
        return Pod {
            namespace,
            pod,
            container,
        };
    }
    Pod {
        namespace: String::new(),
        pod: c.pod_uid.clone().unwrap_or_default(),
        container: c
            .container_id
            .as_deref()
            .map(|i| i[..i.len().min(12)].to_string())
            .unwrap_or_default(),
    }
}

/// The metrics as they stand, in the OpenMetrics text format.
pub fn render(st: &State, counters: &Counters, names: &mut PodNames) -> String {
    let mut reg = Registry::default();
    let info = Family::<Version, Gauge>::default();
    info.get_or_create(&Version {
        version: env!("CARGO_PKG_VERSION").into(),
    })
    .set(1);
    reg.register("shmtrace_build_info", "shmtrace version", info);

    // A mount belongs to the container of a live process in its namespace.
    let ns_container: BTreeMap<u32, Option<&Container>> = st
        .procs
        .alive()
        .map(|p| (p.mnt_ns, p.container.as_ref()))
        .collect();
    let size = Family::<MountLabels, Gauge>::default();
    let used = Family::<MountLabels, Gauge>::default();
    let peak = Family::<MountLabels, Gauge>::default();
    let tracked = Family::<MountLabels, Gauge>::default();
    for m in st.mount_stats.by_dev.values() {
        let labels = MountLabels {
            mountpoint: m.mountpoint.clone().unwrap_or_default(),
            dev: m.dev.clone(),
            pod: pod(ns_container.get(&m.mount_ns).copied().flatten(), names),
        };
        if let Some(v) = m.size_bytes {
            size.get_or_create(&labels).set(v as i64);
        }
        if let Some(v) = m.used_bytes {
            used.get_or_create(&labels).set(v as i64);
        }
        peak.get_or_create(&labels).set(m.peak_used_bytes as i64);
        tracked.get_or_create(&labels).set(m.tracked_bytes as i64);
    }
    reg.register(
        "shmtrace_tmpfs_size_bytes",
        "Size limit of a tmpfs mount (/dev/shm)",
        size,
    );
    reg.register(
        "shmtrace_tmpfs_used_bytes",
        "Bytes in use on a tmpfs mount",
        used,
    );
    reg.register(
        "shmtrace_tmpfs_peak_used_bytes",
        "Highest use seen on a tmpfs mount",
        peak,
    );
    reg.register(
        "shmtrace_tmpfs_tracked_bytes",
        "Bytes of the tmpfs files shmtrace attributes to processes",
        tracked,
    );

    let held = Family::<Pod, Gauge>::default();
    let mut by_container: BTreeMap<String, (Option<&Container>, BTreeSet<u32>)> = BTreeMap::new();
    for p in st.procs.alive() {
        let key = p
            .container
            .as_ref()
            .map(|c| c.cgroup.clone())
            .unwrap_or_default();
        by_container
            .entry(key)
            .or_insert((p.container.as_ref(), BTreeSet::new()))
            .1
            .insert(p.pid);
    }
    for (c, pids) in by_container.values() {
        let bytes = st.files.held_by_any(pids);
        if bytes > 0 {
            held.get_or_create(&pod(*c, names)).set(bytes as i64);
        }
    }
    reg.register(
        "shmtrace_container_shm_held_bytes",
        "Bytes of tmpfs files a container's processes keep alive (each file once)",
        held,
    );

    let failures = Family::<FailureLabels, Counter>::default();
    for f in st.failures.all() {
        failures
            .get_or_create(&FailureLabels {
                reason: f.reason.name().to_string(),
                kind: f.kind.to_string(),
                pod: pod(f.container.as_ref(), names),
            })
            .inc_by(1 + f.repeats);
    }
    reg.register(
        "shmtrace_shm_failures",
        "Shared-memory failures seen, by cause and kind (repeats included)",
        failures,
    );

    let lost = Family::<Stage, Counter>::default();
    let l = &counters.lost;
    for (stage, n) in [
        ("events_ring", l.events_ring),
        ("failures_ring", l.failures_ring),
        ("traced_map_full", l.traced_map_full),
    ] {
        lost.get_or_create(&Stage {
            stage: stage.into(),
        })
        .inc_by(n);
    }
    reg.register("shmtrace_events_lost", "Kernel events lost, by stage", lost);
    let held_back = Family::<Stage, Counter>::default();
    for (stage, n) in [
        ("failure_records", counters.suppressed.failure_records),
        ("sent_sigbus", counters.suppressed.sent_sigbus),
    ] {
        held_back
            .get_or_create(&Stage {
                stage: stage.into(),
            })
            .inc_by(n);
    }
    reg.register(
        "shmtrace_records_suppressed",
        "Records held back because a process was over its budget",
        held_back,
    );
    let events: Counter = Counter::default();
    events.inc_by(st.evidence.events_seen);
    reg.register("shmtrace_events", "Kernel events received", events);
    let procs: Gauge = Gauge::default();
    procs.set(st.procs.len() as i64);
    reg.register(
        "shmtrace_tracked_processes",
        "Processes in shmtrace's state",
        procs,
    );
    let files: Gauge = Gauge::default();
    files.set(st.files.files.len() as i64);
    reg.register(
        "shmtrace_tracked_files",
        "tmpfs files in shmtrace's state",
        files,
    );

    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = encode(&mut out, &reg);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::{Dev, Event, FailedCall, FileRef, Header, MountPages, Syscall},
        host::fixture::{Fixture, SELF_NS},
    };

    #[test]
    fn renders_mounts_failures_and_losses_with_escaped_labels() {
        let dev = Dev(40);
        let mut host = Fixture::with_shm(dev, 64 << 20);
        let mut st = State::new(0, &mut host);
        let h = Header {
            ts_ns: 10,
            pid: 5,
            tid: 5,
            ppid: 1,
            ns_pid: 0,
            mnt_ns: SELF_NS,
            cgroup_id: 0,
            comm: "w".into(),
        };
        let file = FileRef {
            dev,
            ino: 2,
            name: Some("a\"b".into()),
            size: 0,
            allocated: 0,
            unlinked: false,
            mount: MountPages {
                dev,
                max_pages: 0,
                used_pages: 0,
            },
        };
        for _ in 0..3 {
            st.apply(
                &Event::SyscallFailed {
                    h: h.clone(),
                    errno: libc::ENOSPC,
                    limits: None,
                    mnt_flags: 0,
                    call: FailedCall::OnFile {
                        syscall: Syscall::Fallocate,
                        fd: 3,
                        offset: Some(0),
                        bytes: Some(1 << 20),
                        prot: None,
                        mountpoint: None,
                        file: file.clone(),
                    },
                },
                &mut host,
            );
        }
        st.tick(&mut host);
        let mut c = Counters::default();
        c.lost.events_ring = 7;
        let text = render(&st, &c, &mut PodNames::default());
        assert!(text.contains("shmtrace_tmpfs_size_bytes{mountpoint=\"/dev/shm\",dev=\"0:40\",namespace=\"\",pod=\"\",container=\"\"} 67108864"), "{text}");
        assert!(text.contains("shmtrace_shm_failures_total{reason=\"tmpfs_full\",kind=\"enospc\",namespace=\"\",pod=\"\",container=\"\"} 3"), "{text}");
        assert!(
            text.contains("shmtrace_events_lost_total{stage=\"events_ring\"} 7"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
        // A hostile mount point cannot forge a line.
        let mut st2 = st;
        for m in st2.mount_stats.by_dev.values_mut() {
            m.mountpoint = Some("/x\"} 1\nshmtrace_fake 2".into());
        }
        let text = render(&st2, &c, &mut PodNames::default());
        assert!(
            !text.lines().any(|l| l.starts_with("shmtrace_fake")),
            "{text}"
        );
    }
}
