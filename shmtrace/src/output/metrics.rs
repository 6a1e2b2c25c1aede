//! Prometheus metrics for the DaemonSet (`--metrics ADDR`): /dev/shm size,
//! use and peak per mount, bytes held per container, failures and losses.
//! Labels follow the Prometheus naming guide: no pid as a label. Rendered
//! with prometheus-client (OpenMetrics text, its escaping) from the state
//! at the moment of a scrape, then served as the scraper asks: the classic
//! text format 0.0.4 by default, OpenMetrics when its Accept header names
//! it. Samples are sorted within each family, so two scrapes list the same
//! series in the same order. `serve` answers the HTTP side.

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

/// Which identity labels series carry (`--metrics-labels`, like
/// Tetragon's metricsLabelFilter): fewer labels, fewer series. A label left
/// out is empty, and the series it split are summed.
#[derive(Clone, Copy, Debug)]
pub struct LabelSet {
    pub namespace: bool,
    pub pod: bool,
    pub container: bool,
    pub container_id: bool,
}

impl Default for LabelSet {
    fn default() -> Self {
        Self {
            namespace: true,
            pod: true,
            container: true,
            container_id: true,
        }
    }
}

impl std::str::FromStr for LabelSet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut l = Self {
            namespace: false,
            pod: false,
            container: false,
            container_id: false,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "namespace" => l.namespace = true,
                "pod" => l.pod = true,
                "container" => l.container = true,
                "container_id" => l.container_id = true,
                x => {
                    return Err(format!(
                        "unknown label `{x}` (use namespace, pod, container, container_id)"
                    ));
                }
            }
        }
        Ok(l)
    }
}

/// Who a series is about: names when the kubelet's logs tell them, else
/// the pod UID and a short container id; empty for the host.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Pod {
    namespace: String,
    pod: String,
    container: String,
    /// `<runtime>://<64 hex>`, as kube-state-metrics writes a pod's
    /// container ids: the join to its series and to the runtime's tools.
    container_id: String,
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabels {
    need: String,
    backend: String,
}

/// Kubernetes names when known (pod namespace, pod, container); else a
/// runtime's container name, or the pod UID and a short container id;
/// empty for the host. Only the labels in `keep`.
fn pod(c: Option<&Container>, keep: LabelSet) -> Pod {
    let Some(c) = c else {
        return Pod::default();
    };
    let short = c
        .container_id
        .as_deref()
        .map(|i| i[..i.len().min(12)].to_string());
    let mut p = match &c.pod {
        Some(k) => Pod {
            namespace: k.namespace.clone(),
            pod: k.name.clone(),
            container: k.container.name.clone().or(short).unwrap_or_default(),
            container_id: String::new(),
        },
        None => Pod {
            namespace: String::new(),
            pod: c.pod_uid.clone().unwrap_or_default(),
            container: c.name.clone().or(short).unwrap_or_default(),
            container_id: String::new(),
        },
    };
    if keep.container_id
        && let Some(id) = &c.container_id
    {
        p.container_id = match &c.runtime {
            Some(rt) => format!("{rt}://{id}"),
            None => id.clone(),
        };
    }
    if !keep.namespace {
        p.namespace.clear();
    }
    if !keep.pod {
        p.pod.clear();
    }
    if !keep.container {
        p.container.clear();
    }
    p
}

/// The two exposition formats Prometheus scrapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4`: what every scraper and `promtool check
    /// metrics` read.
    Text,
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// What a request's Accept header asks for: OpenMetrics only when it
    /// names it (Prometheus lists it first when it prefers it).
    pub fn from_accept(accept: Option<&str>) -> Self {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }
}

/// The metrics as they stand, in `format`.
pub fn render(st: &State, counters: &Counters, keep: LabelSet, format: Format) -> String {
    let om = sorted(&openmetrics(st, counters, keep));
    match format {
        Format::OpenMetrics => om,
        Format::Text => classic(&om),
    }
}

/// Sorts the samples of each family (prometheus-client keeps them in hash
/// order), leaving the `#` lines of each family in front of them.
fn sorted(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    let mut samples: Vec<&str> = Vec::new();
    let flush = |out: &mut String, samples: &mut Vec<&str>| {
        samples.sort_unstable();
        for l in samples.drain(..) {
            out.push_str(l);
            out.push('\n');
        }
    };
    for line in om.lines() {
        if line.starts_with('#') {
            flush(&mut out, &mut samples);
            out.push_str(line);
            out.push('\n');
        } else {
            samples.push(line);
        }
    }
    flush(&mut out, &mut samples);
    out
}

/// OpenMetrics to the classic text format: a counter family is named by
/// its samples (`x_total`, with HELP and TYPE under that name), and there
/// is no `# UNIT` or `# EOF`. Label values are escaped the same way in both.
fn classic(om: &str) -> String {
    let mut counters: BTreeSet<&str> = BTreeSet::new();
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ")
            && let Some(name) = rest.strip_suffix(" counter")
        {
            counters.insert(name);
        }
    }
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find(|p| line.starts_with(p));
        match meta {
            Some(p) => {
                let rest = &line[p.len()..];
                let name = rest.split(' ').next().unwrap_or_default();
                out.push_str(p);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                out.push_str(&rest[name.len()..]);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// The metrics as they stand, in the OpenMetrics text format (unsorted).
fn openmetrics(st: &State, counters: &Counters, keep: LabelSet) -> String {
    let mut reg = Registry::default();
    let info = Family::<Version, Gauge>::default();
    info.get_or_create(&Version {
        version: env!("CARGO_PKG_VERSION").into(),
    })
    .set(1);
    reg.register("shmtrace_build_info", "shmtrace version", info);
    let hooks = Family::<HookLabels, Gauge>::default();
    for (need, backend) in &counters.hooks {
        hooks
            .get_or_create(&HookLabels {
                need: need.to_string(),
                backend: backend.to_string(),
            })
            .set(1);
    }
    reg.register(
        "shmtrace_hooks",
        "Which kernel hooks carry each need of the capture (backend: trampolines, tracepoints, or none: a need no tmpfs code sees, left unseen with trampolines; --hooks)",
        hooks,
    );

    let size = Family::<MountLabels, Gauge>::default();
    let used = Family::<MountLabels, Gauge>::default();
    let peak = Family::<MountLabels, Gauge>::default();
    let tracked = Family::<MountLabels, Gauge>::default();
    let room = Family::<MountLabels, Gauge>::default();
    for m in st.mount_stats().all() {
        let labels = MountLabels {
            mountpoint: m.mountpoint.clone().unwrap_or_default(),
            dev: m.dev.to_string(),
            // The container owning the namespace it is seen from; none
            // for the host's own mounts.
            pod: pod(st.mount_container(m.view_ns), keep),
        };
        if let Some(v) = m.size_bytes {
            size.get_or_create(&labels).set(v as i64);
        }
        if let Some(v) = m.used_bytes {
            used.get_or_create(&labels).set(v as i64);
        }
        peak.get_or_create(&labels).set(m.peak_used_bytes as i64);
        tracked.get_or_create(&labels).set(m.tracked_bytes as i64);
        if let Some(v) = m.memory_room_bytes {
            room.get_or_create(&labels).set(v as i64);
        }
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
    reg.register(
        "shmtrace_tmpfs_memory_room_bytes",
        "What the memory cgroup of a tmpfs mount's writers leaves for shared memory (limit less its other use); a size above it means an OOM kill before the mount fills",
        room,
    );

    let held = Family::<Pod, Gauge>::default();
    let mut by_container: BTreeMap<String, (Option<&Container>, BTreeSet<u32>)> = BTreeMap::new();
    for p in st.procs().alive() {
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
        let bytes = st.files().held_by_any(pids);
        if bytes > 0 {
            held.get_or_create(&pod(*c, keep)).inc_by(bytes as i64);
        }
    }
    reg.register(
        "shmtrace_container_shm_held_bytes",
        "Bytes of tmpfs files a container's processes keep alive (each file once)",
        held,
    );

    let failures = Family::<FailureLabels, Counter>::default();
    for f in st.failures().all() {
        failures
            .get_or_create(&FailureLabels {
                reason: f.reason.name().to_string(),
                kind: f.kind.to_string(),
                pod: pod(st.named(f.container.as_ref()), keep),
            })
            .inc_by(1 + f.repeats);
    }
    // Left behind: named files nobody holds, whose creator has exited (a
    // crashed job's segments), by the creator's pod or container.
    let leftover = Family::<Pod, Gauge>::default();
    for f in st.files().all() {
        if f.unlinked || !f.fd_holders.is_empty() || !f.map_holders.is_empty() {
            continue;
        }
        let creator = f.creator.and_then(|pid| st.procs().get(pid));
        if creator.is_some_and(|p| p.alive()) {
            continue;
        }
        let c = creator.and_then(|p| st.named(p.container.as_ref()));
        leftover
            .get_or_create(&pod(c, keep))
            .inc_by(f.allocated_bytes as i64);
    }
    reg.register(
        "shmtrace_shm_leftover_bytes",
        "Bytes of named tmpfs files nobody holds whose creator exited (left behind)",
        leftover,
    );
    let incidents = Family::<Pod, Counter>::default();
    let open = Family::<Pod, Gauge>::default();
    // Node totals: present from the start at 0, so `increase()` and
    // alerts see the first incident as a change rather than a new series.
    let node_incidents: Counter = Counter::default();
    let node_open: Gauge = Gauge::default();
    let node_failures: Counter = Counter::default();
    for f in st.failures().all() {
        node_failures.inc_by(1 + f.repeats);
    }
    for i in st.incidents().all() {
        node_incidents.inc();
        node_open.inc_by(i64::from(i.is_open()));
        let c = st
            .failures()
            .all()
            .iter()
            .find(|f| f.incident == i.id)
            .and_then(|f| st.named(f.container.as_ref()));
        let labels = pod(c, keep);
        incidents.get_or_create(&labels).inc();
        open.get_or_create(&labels).inc_by(i64::from(i.is_open()));
    }
    reg.register(
        "shmtrace_incidents",
        "Incidents on this node (a tmpfs mount that failed)",
        node_incidents,
    );
    reg.register(
        "shmtrace_incidents_open",
        "Incidents on this node still open (a failure within --incident-quiet)",
        node_open,
    );
    reg.register(
        "shmtrace_failures",
        "Shared-memory failures on this node (repeats included)",
        node_failures,
    );
    reg.register(
        "shmtrace_pod_incidents",
        "Incidents (a tmpfs mount that failed), by pod or container",
        incidents,
    );
    reg.register(
        "shmtrace_pod_incidents_open",
        "Incidents still open (a failure within --incident-quiet), by pod or container",
        open,
    );
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
    events.inc_by(st.evidence().events_seen());
    reg.register("shmtrace_events", "Kernel events received", events);
    let procs: Gauge = Gauge::default();
    procs.set(st.procs().len() as i64);
    reg.register(
        "shmtrace_tracked_processes",
        "Processes in shmtrace's state",
        procs,
    );
    let files: Gauge = Gauge::default();
    files.set(st.files().len() as i64);
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
#[path = "metrics_tests.rs"]
mod tests;
