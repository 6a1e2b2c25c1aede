//! The JSON report (`--report FILE`): everything the summary says, and the
//! evidence behind it, for machines.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::{
    aggregate::{Aggregator, Failure, MountAtFailure, MountStat, OtherSignal},
    attribution::FileState,
    procs::Proc,
};

/// A tmpfs mount: its use now and at its peak, and at the first failure on it.
#[derive(Serialize)]
pub struct MountReport {
    #[serde(flatten)]
    pub stat: MountStat,
    pub at_first_failure: Option<MountAtFailure>,
}

/// A container (or the host's cgroup) and the bytes its processes hold.
#[derive(Serialize)]
pub struct ContainerReport {
    pub cgroup: String,
    pub runtime: Option<String>,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    /// Bytes of tmpfs files held by any of its processes, each file once.
    pub held_bytes: u64,
    pub allocated_bytes: u64,
    pub pids: Vec<u32>,
}

/// A process tree shmtrace was asked to trace, totalled without counting a
/// shared file twice.
#[derive(Serialize)]
pub struct TreeReport {
    pub root: u32,
    pub pids: Vec<u32>,
    pub held_bytes: u64,
    pub allocated_bytes: u64,
}

pub const SCHEMA: u32 = 1;

#[derive(Serialize)]
pub struct Lost {
    /// Ordinary events dropped because their ring buffer was full.
    pub events_ring: u64,
    /// Failure events dropped because their ring buffer was full.
    pub failures_ring: u64,
    /// New child processes that could not be followed (traced map full).
    pub traced_map_full: u64,
}

#[derive(Serialize)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// What shmtrace itself exits with: code, or 128 + signal.
    pub status: i32,
}

#[derive(Serialize)]
pub struct Report {
    pub schema: u32,
    pub version: &'static str,
    /// "run", "pid" or "demo".
    pub mode: &'static str,
    pub command: Option<Vec<String>>,
    pub target_pid: Option<u32>,
    pub duration_s: f64,
    /// The answer: signature, summary, what the framework got wrong, the
    /// /dev/shm size this workload needs.
    pub diagnosis: Option<crate::diagnosis::Diagnosis>,
    pub first_failure: Option<Failure>,
    pub failures: Vec<Failure>,
    pub processes: Vec<Proc>,
    pub mounts: Vec<MountReport>,
    pub containers: Vec<ContainerReport>,
    pub trees: Vec<TreeReport>,
    /// tmpfs files shmtrace tracked, named or unlinked, with their holders.
    pub files: Vec<FileState>,
    /// Shared-memory segments over the whole run (freed ones included).
    pub segments: crate::attribution::Segments,
    /// SIGBUS signals that were not shared-memory failures, and why.
    pub other_sigbus: Vec<OtherSignal>,
    pub lost_events: u64,
    pub lost: Lost,
    pub events_received: u64,
    pub events_by_kind: BTreeMap<String, u64>,
    pub exit: Option<Exit>,
    pub notes: Vec<String>,
}

pub struct Context_ {
    pub mode: &'static str,
    pub command: Option<Vec<String>>,
    pub target_pid: Option<u32>,
    pub duration_s: f64,
    pub lost: [u64; 3],
    pub exit: Option<Exit>,
    pub notes: Vec<String>,
}

impl Report {
    pub fn build(agg: &Aggregator, ctx: Context_) -> Self {
        let failures = agg.ordered_failures();
        let mut r = Self {
            schema: SCHEMA,
            version: env!("CARGO_PKG_VERSION"),
            mode: ctx.mode,
            command: ctx.command,
            target_pid: ctx.target_pid,
            duration_s: ctx.duration_s,
            diagnosis: None,
            first_failure: failures.first().cloned(),
            failures,
            processes: agg.procs.values().cloned().collect(),
            mounts: mounts(agg),
            containers: containers(agg),
            trees: trees(agg),
            files: agg.attr.files.values().cloned().collect(),
            segments: agg.attr.segments.clone(),
            other_sigbus: agg.other_signals.clone(),
            lost_events: ctx.lost.iter().sum(),
            lost: Lost {
                events_ring: ctx.lost[0],
                failures_ring: ctx.lost[1],
                traced_map_full: ctx.lost[2],
            },
            events_received: agg.events_seen,
            events_by_kind: agg
                .by_kind
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            exit: ctx.exit,
            notes: ctx.notes,
        };
        r.diagnosis = crate::diagnosis::diagnose(&r);
        r
    }

    /// Writes atomically (temp file + rename): readers never see half a report.
    pub fn write(&self, path: &std::path::Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        let tmp = path.with_extension("tmp-shmtrace");
        std::fs::write(&tmp, text + "\n")
            .with_context(|| format!("cannot write report {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("cannot write report {}", path.display()))
    }
}

fn mounts(agg: &Aggregator) -> Vec<MountReport> {
    let mut devs: Vec<u32> = agg.mount_stats.keys().copied().collect();
    devs.extend(
        agg.touched_mounts
            .keys()
            .filter(|d| !agg.mount_stats.contains_key(d)),
    );
    devs.into_iter()
        .map(|dev| {
            let at = agg.touched_mounts.get(&dev).cloned();
            let stat = agg.mount_stats.get(&dev).cloned().unwrap_or_else(|| {
                let a = at.clone().expect("a touched mount");
                MountStat {
                    mountpoint: a.mountpoint,
                    dev: a.dev,
                    mount_ns: a.mount_ns,
                    size_bytes: a.size_bytes,
                    used_bytes: a.used_bytes,
                    free_bytes: a.free_bytes,
                    peak_used_bytes: a.used_bytes.unwrap_or(0),
                    tracked_bytes: 0,
                    explained_share: None,
                }
            });
            MountReport {
                stat,
                at_first_failure: at,
            }
        })
        .collect()
}

fn containers(agg: &Aggregator) -> Vec<ContainerReport> {
    let mut by_cgroup: BTreeMap<String, ContainerReport> = BTreeMap::new();
    for p in agg.procs.values() {
        let Some(c) = &p.container else { continue };
        let e = by_cgroup
            .entry(c.cgroup.clone())
            .or_insert_with(|| ContainerReport {
                cgroup: c.cgroup.clone(),
                runtime: c.runtime.clone(),
                container_id: c.container_id.clone(),
                pod_uid: c.pod_uid.clone(),
                held_bytes: 0,
                allocated_bytes: 0,
                pids: Vec::new(),
            });
        e.pids.push(p.pid);
        e.allocated_bytes += p.allocated_bytes;
    }
    for c in by_cgroup.values_mut() {
        c.held_bytes = agg.attr.held_by_any(&c.pids.iter().copied().collect());
    }
    by_cgroup.into_values().collect()
}

fn trees(agg: &Aggregator) -> Vec<TreeReport> {
    agg.procs
        .values()
        .filter(|p| p.root)
        .map(|root| {
            let mut pids = vec![root.pid];
            let mut i = 0;
            while i < pids.len() && pids.len() < 100_000 {
                let parent = pids[i];
                pids.extend(
                    agg.procs
                        .values()
                        .filter(|p| p.ppid == parent && !p.root && p.pid != parent)
                        .map(|p| p.pid),
                );
                i += 1;
            }
            pids.sort();
            pids.dedup();
            TreeReport {
                root: root.pid,
                held_bytes: agg.attr.held_by_any(&pids.iter().copied().collect()),
                allocated_bytes: pids
                    .iter()
                    .filter_map(|p| agg.procs.get(p))
                    .map(|p| p.allocated_bytes)
                    .sum(),
                pids,
            }
        })
        .collect()
}
