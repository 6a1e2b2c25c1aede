//! The facts at one moment, gathered from state: what the report, the
//! summary and the diagnosis are made of.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    capture::{Counters, Losses, Suppressed},
    event::Dev,
    host::blocking::Stalls,
    state::{
        State,
        failures::{Failure, MountAtFailure, OtherSignal},
        files::{FileState, Segments},
        mount_stats::MountStat,
        procs::Proc,
    },
};

/// A tmpfs mount: its use now and at its peak, and at the first failure on it.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct MountReport {
    #[serde(flatten)]
    pub stat: MountStat,
    pub at_first_failure: Option<MountAtFailure>,
    /// Bytes of the files in `leftovers` (all of them, not only those listed).
    pub leftover_bytes: u64,
    /// Named files nobody holds whose creator has exited (a crashed job's
    /// segments), largest first, at most [`MAX_LEFTOVERS`].
    pub leftovers: Vec<Leftover>,
}

pub const MAX_LEFTOVERS: usize = 100;

/// A file left behind on a tmpfs mount.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Leftover {
    /// Its name (escaped).
    pub name: Option<String>,
    /// Its inode number.
    pub ino: u64,
    /// Its allocated bytes.
    pub bytes: u64,
    /// The process that created it.
    pub creator_pid: u32,
    /// That process's name.
    pub creator_comm: String,
    /// The creator's container (runtime name, else id), if any.
    pub creator_container: Option<String>,
    /// When the creator exited, in seconds since tracing began.
    pub creator_exited_s: f64,
}

/// A container (or the host's cgroup) and the bytes its processes hold.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct ContainerReport {
    /// The cgroup path its processes are in.
    pub cgroup: String,
    /// The container runtime (podman, docker, containerd, cri-o), when known.
    pub runtime: Option<String>,
    /// The runtime's 64-hex container id, when known.
    pub container_id: Option<String>,
    /// The Kubernetes pod UID, from the cgroup path, when in a pod.
    pub pod_uid: Option<String>,
    /// The container's name, when the runtime or kubelet told it.
    pub name: Option<String>,
    pub pod: Option<crate::state::containers::Pod>,
    /// Bytes of tmpfs files held by any of its processes, each file once.
    pub held_bytes: u64,
    /// Bytes of tmpfs pages its processes allocated that are still live.
    pub allocated_bytes: u64,
    /// Its traced processes.
    pub pids: Vec<u32>,
}

/// A process tree shmtrace was asked to trace, totalled without counting a
/// shared file twice.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct TreeReport {
    /// The pid shmtrace was asked to trace.
    pub root: u32,
    /// It and every descendant seen.
    pub pids: Vec<u32>,
    /// Bytes of tmpfs files the tree holds, each file once.
    pub held_bytes: u64,
    /// Bytes of tmpfs pages the tree allocated that are still live.
    pub allocated_bytes: u64,
}

pub const SCHEMA: u32 = 2;

/// Counts of what the state's caps let go of.
#[derive(Clone, Copy, Debug, Default, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Dropped {
    /// Exited processes no failure named, beyond the most recent 2,048.
    pub exited_processes: u64,
    /// Distinct failures beyond the first 1,000 (their repeats included).
    pub failures: u64,
    /// Kinds of other SIGBUS beyond the first 256.
    pub other_sigbus: u64,
    /// Files nobody held, beyond 16,384 tracked.
    pub files: u64,
}

#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Exit {
    /// The exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that killed it, when one did.
    pub signal: Option<i32>,
    /// What shmtrace itself exits with: code, or 128 + signal.
    pub status: i32,
}

#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Facts {
    /// The report format's version: 2 (schema/report.v2.schema.json).
    pub schema: u32,
    /// The shmtrace version that wrote it.
    pub version: &'static str,
    /// "run", "pid" or "demo".
    pub mode: &'static str,
    #[serde(skip)]
    pub node: bool,
    /// `run`: the command and its arguments (null otherwise).
    pub command: Option<Vec<String>>,
    /// `--pid`: the traced process (null otherwise).
    pub target_pid: Option<u32>,
    /// Seconds from the start of tracing to this report.
    pub duration_s: f64,
    pub first_failure: Option<Failure>,
    /// Every distinct shared-memory failure, in kernel time order (repeats counted on the first).
    pub failures: Vec<Failure>,
    /// Every process traced (the exited ones kept within a bound), with what it allocated and held.
    pub processes: Vec<Proc>,
    /// Every tmpfs mount that held tracked files, failed, or is some traced namespace's /dev/shm.
    pub mounts: Vec<MountReport>,
    /// Containers (and pods) of the traced processes, with the bytes they hold.
    pub containers: Vec<ContainerReport>,
    /// The process trees shmtrace was asked to trace (`run`, `--pid`).
    pub trees: Vec<TreeReport>,
    /// tmpfs files shmtrace tracked, named or unlinked, with their holders.
    pub files: Vec<FileState>,
    /// Shared-memory segments over the whole run (freed ones included).
    pub segments: Segments,
    /// SIGBUS signals that were not shared-memory failures, and why.
    pub other_sigbus: Vec<OtherSignal>,
    /// Kernel events lost, all stages together (see `lost`).
    pub lost_events: u64,
    pub lost: Losses,
    /// Records the kernel side held back on purpose (a process over its
    /// budget), and who was held back most.
    pub suppressed: Suppressed,
    /// Reads of /proc, statfs and stat that hung (a stuck mount or
    /// process) and were given up, or skipped after one did.
    pub host_reads: Stalls,
    /// What the bounded state let go of: nothing grows without bound, and
    /// nothing goes uncounted.
    pub dropped: Dropped,
    /// Kernel events received and applied.
    pub events_received: u64,
    /// Events received, by kind (fork, exec, open, mmap, sigbus...).
    pub events_by_kind: BTreeMap<String, u64>,
    pub exit: Option<Exit>,
    /// Remarks on the run itself (a hook the kernel refused, a traced pid that exited).
    pub notes: Vec<String>,
}

pub struct Context {
    pub mode: &'static str,
    /// Node-wide: one diagnosis per incident, the first leads.
    pub node: bool,
    pub command: Option<Vec<String>>,
    pub target_pid: Option<u32>,
    pub duration_s: f64,
    pub counters: Counters,
    pub host_stalls: Stalls,
    pub exit: Option<Exit>,
    pub notes: Vec<String>,
}

impl Facts {
    pub fn gather(st: &State, ctx: Context) -> Self {
        let mut failures = st.failures().ordered();
        // Names found after the failure (a pod's logs appear late).
        for f in &mut failures {
            super::causes::word(f);
            if let Some(c) = f.container.as_mut()
                && let Some(now) = st.containers().by_cgroup(&c.cgroup)
            {
                c.clone_from(now);
            }
        }
        Self {
            schema: SCHEMA,
            version: env!("CARGO_PKG_VERSION"),
            mode: ctx.mode,
            node: ctx.node,
            command: ctx.command,
            target_pid: ctx.target_pid,
            duration_s: ctx.duration_s,
            first_failure: failures.first().cloned(),
            failures,
            processes: st.procs().all().cloned().collect(),
            mounts: mounts(st),
            containers: containers(st),
            trees: trees(st),
            files: st.files().all().into_iter().cloned().collect(),
            segments: st.files().segments().clone(),
            other_sigbus: st.failures().other().to_vec(),
            lost_events: ctx.counters.lost.total(),
            lost: ctx.counters.lost,
            suppressed: ctx.counters.suppressed,
            host_reads: ctx.host_stalls,
            dropped: Dropped {
                exited_processes: st.procs().forgotten(),
                failures: st.failures().dropped().0,
                other_sigbus: st.failures().dropped().1,
                files: st.files().dropped(),
            },
            events_received: st.evidence().events_seen(),
            events_by_kind: st
                .evidence()
                .by_kind()
                .iter()
                .map(|(k, v)| (k.name().to_string(), *v))
                .collect(),
            exit: ctx.exit,
            notes: ctx.notes,
        }
    }

    pub fn process(&self, pid: u32) -> Option<&Proc> {
        self.processes.iter().find(|p| p.pid == pid)
    }
}

fn mounts(st: &State) -> Vec<MountReport> {
    let (stats, failures) = (st.mount_stats(), st.failures());
    let mut devs: Vec<Dev> = stats.all().map(|m| m.dev).collect();
    devs.extend(failures.touched_devs().filter(|d| stats.get(*d).is_none()));
    devs.into_iter()
        .map(|dev| {
            let at = failures.at_first_failure(dev).cloned();
            let stat = stats.get(dev).cloned().unwrap_or_else(|| {
                let a = at.clone().expect("a touched mount");
                MountStat {
                    mountpoint: a.mountpoint,
                    host_mountpoint: a.host_mountpoint,
                    dev: a.dev,
                    mount_ns: a.mount_ns,
                    view_ns: a.mount_ns,
                    size_bytes: a.size_bytes,
                    used_bytes: a.used_bytes,
                    free_bytes: a.free_bytes,
                    peak_used_bytes: a.used_bytes.unwrap_or(0),
                    tracked_bytes: 0,
                    explained_share: None,
                    memory_headroom: None,
                    headroom: None,
                    memory_room_bytes: None,
                }
            });
            let mut stat = stat;
            stat.memory_headroom = stat
                .headroom
                .as_ref()
                .map(|h| super::causes::headroom(stat.mountpoint.as_deref(), h));
            let (leftover_bytes, leftovers) = leftovers_on(st, dev);
            MountReport {
                stat,
                at_first_failure: at,
                leftover_bytes,
                leftovers,
            }
        })
        .collect()
}

/// Named files on `dev` that nobody holds and whose creator has exited.
fn leftovers_on(st: &State, dev: Dev) -> (u64, Vec<Leftover>) {
    let mut v: Vec<Leftover> = st
        .files()
        .on(dev)
        .filter(|f| !f.unlinked && f.allocated_bytes > 0)
        .filter(|f| f.fd_holders.is_empty() && f.map_holders.is_empty())
        .filter_map(|f| {
            let p = st.procs().get(f.creator?)?;
            let exited = p.exit_ts_ns?;
            let c = p.container.as_ref();
            Some(Leftover {
                name: f.name.clone(),
                ino: f.ino,
                bytes: f.allocated_bytes,
                creator_pid: p.pid,
                creator_comm: p.comm.clone(),
                creator_container: c.and_then(|c| c.name.clone().or(c.container_id.clone())),
                creator_exited_s: st.since_start(exited),
            })
        })
        .collect();
    v.sort_by_key(|l| std::cmp::Reverse(l.bytes));
    let total = v.iter().map(|l| l.bytes).sum();
    v.truncate(MAX_LEFTOVERS);
    (total, v)
}

fn containers(st: &State) -> Vec<ContainerReport> {
    let mut by_cgroup: BTreeMap<String, ContainerReport> = BTreeMap::new();
    for p in st.procs().all() {
        let Some(c) = &p.container else { continue };
        let e = by_cgroup
            .entry(c.cgroup.clone())
            .or_insert_with(|| ContainerReport {
                cgroup: c.cgroup.clone(),
                runtime: c.runtime.clone(),
                container_id: c.container_id.clone(),
                pod_uid: c.pod_uid.clone(),
                name: c.name.clone(),
                pod: c.pod.clone(),
                held_bytes: 0,
                allocated_bytes: 0,
                pids: Vec::new(),
            });
        e.pids.push(p.pid);
        e.allocated_bytes += p.allocated_bytes;
    }
    for c in by_cgroup.values_mut() {
        c.held_bytes = st.files().held_by_any(&c.pids.iter().copied().collect());
    }
    by_cgroup.into_values().collect()
}

fn trees(st: &State) -> Vec<TreeReport> {
    st.procs()
        .all()
        .filter(|p| p.root)
        .map(|root| {
            let pids = st.procs().tree_of(root.pid);
            TreeReport {
                root: root.pid,
                held_bytes: st.files().held_by_any(&pids.iter().copied().collect()),
                allocated_bytes: pids
                    .iter()
                    .filter_map(|p| st.procs().get(*p))
                    .map(|p| p.allocated_bytes)
                    .sum(),
                pids,
            }
        })
        .collect()
}
