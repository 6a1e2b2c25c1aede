//! From evidence to an answer: the failure's signature in the user's
//! language, what the framework printed and what it got wrong, and the
//! /dev/shm size this workload needs, with the ways to get it.

use serde::Serialize;

use super::{
    leftovers::{describe_leftovers, describe_strays, leftovers, memory_headroom},
    pytorch::{PREFETCH, dataloader_fit, dataloader_in_flight, pytorch_kind, pytorch_messages},
    scope::Scope,
    segments::{largest_segment, workers_allocating},
    users::User,
    words::{human_mib, kubernetes_snippet, runtime_fix, shown_pid},
};
use crate::{
    state::{failures::FailureKind, procs::Proc},
    units::human_bytes,
};

use crate::units::MIB;
/// Sizes are rounded up to this, the way people write --shm-size.
const ROUND: u64 = 64 * MIB;

#[derive(Clone, Debug, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Diagnosis {
    /// Stable identifier, "<user>:<what>": the user is pytorch-dataloader,
    /// python-shared-memory, nccl, ray-object-store, posix-semaphore or shm
    /// (anything else); what is sigbus, enospc-fallocate, enospc-write...,
    /// or, when /dev/shm did not run out, the cause ("shm:noexec"); an OOM
    /// kill is "memcg:oom-kill".
    pub signature: String,
    /// The framework or library whose failure this is (PyTorch, NCCL, Ray...), when one is recognised.
    pub framework: Option<String>,
    /// The diagnosis in one paragraph.
    pub summary: String,
    /// What the framework prints for this failure.
    pub framework_message: Option<String>,
    /// Where the framework's message misleads, if it does.
    pub framework_misleads: Option<String>,
    /// The /dev/shm size this workload needs, when /dev/shm running out is the cause.
    pub recommended_shm_bytes: Option<u64>,
    /// How the size was computed, headroom included.
    pub basis: Option<String>,
    /// The fix as a docker run flag.
    pub docker: Option<String>,
    /// The fix as a pod spec snippet (a Memory emptyDir at /dev/shm with a sizeLimit).
    pub kubernetes: Option<String>,
    /// The fix in the failing container's own runtime: `podman run
    /// --shm-size=...`, `docker run --shm-size=...`, or a pod's Memory
    /// emptyDir (containerd, CRI-O).
    pub runtime_fix: Option<String>,
    /// The DataLoader settings that would fit the current size instead.
    pub dataloader: Option<String>,
    /// Another library's settings that make it need less /dev/shm (NCCL,
    /// Ray, Python's shared_memory).
    pub knobs: Option<String>,
    /// Named files on the failing mount that nobody held and whose creator
    /// had exited before the failure (a crashed job's segments): which,
    /// whose, how many bytes, and the command that removes them.
    pub leftovers: Option<String>,
    /// Files on the failing mount that no traced process made (there before
    /// tracing began, or made by untraced processes), and how to remove
    /// them if nothing uses them.
    pub strays: Option<String>,
    /// When the failing process's memory cgroup leaves less room than the
    /// mount (or the recommended size): past that, an OOM kill, not ENOSPC.
    pub memory_limit: Option<String>,
    /// When a bigger /dev/shm may not be the fix: one process that did not
    /// fail held most of the bytes (a consumer keeping every batch alive).
    pub caveat: Option<String>,
    /// The fix when /dev/shm did not run out (a limit, a mount option, the
    /// sharing strategy): then no /dev/shm size is recommended.
    pub fix: Option<String>,
}

pub fn diagnose(r: &Scope) -> Option<Diagnosis> {
    let first = r.first_failure?;
    let user = pytorch_kind(r, User::recognize(r));
    let pytorch = user == User::PytorchDataLoader;
    let kind = first.kind.name().replace('_', "-");
    let what = match (first.kind, first.syscall) {
        (FailureKind::Sigbus | FailureKind::OomKill, _) | (_, None) => kind,
        (_, Some(sc)) => format!("{kind}-{sc}"),
    };
    // A cause other than a full tmpfs is named by that cause.
    let what = if first.reason.tmpfs_ran_out() || first.kind == FailureKind::OomKill {
        what
    } else {
        first.reason.name().replace('_', "-")
    };
    let signature = match (first.kind, first.syscall) {
        (FailureKind::OomKill, _) => format!("memcg:{what}"),
        (FailureKind::CudaIpc, Some(call)) => format!("cuda-ipc:{call}"),
        (FailureKind::CudaIpc, None) => "cuda-ipc:call".to_string(),
        _ => format!("{}:{what}", user.id()),
    };
    let proc_of = |pid: u32| r.processes.iter().find(|p| p.pid == pid);
    let mount = first.mount.as_ref();
    let size = mount.and_then(|m| m.size_bytes);

    // Whom would PyTorch's main process name? The lowest pid among the
    // workers that died of a signal (it checks them in pid order).
    let parent = first.ppid;
    // Workers are forked, never exec'd: they keep the parent's command line
    // (helpers such as multiprocessing's resource tracker exec).
    let parent_cmd = proc_of(parent).and_then(|p| p.cmdline.clone());
    let mut workers: Vec<&Proc> = r
        .processes
        .iter()
        .copied()
        // The process shmtrace was given (`run`'s command, `--pid`'s
        // target) is the job's main process, never one of its workers,
        // even when its parent (shmtrace, a shell) is not traced.
        .filter(|p| {
            p.ppid == parent
                && p.pid != parent
                && !p.root
                && (parent_cmd.is_none() || p.cmdline == parent_cmd)
        })
        .collect();
    workers.sort_by_key(|p| (p.first_seen_ns, p.pid));
    let index_of = |pid: u32| workers.iter().position(|p| p.pid == pid);
    let (framework_message, framework_misleads) = if pytorch {
        pytorch_messages(
            r,
            first.pid,
            first.kind,
            first.syscall,
            &workers,
            index_of(first.pid),
        )
    } else {
        (user.message(first.kind), None)
    };

    let left = leftovers(r);
    let left_bytes: u64 = left.iter().map(|f| f.allocated_bytes).sum();
    let (recommended, basis) = recommend(r, pytorch, left_bytes);
    let fits = dataloader_fit(r, pytorch, size, workers_allocating(r));
    let failed_at = mount
        .and_then(|m| Some((m.used_bytes?, m.size_bytes?)))
        .map(|(u, s)| format!(" with {} of {} in use", human_bytes(u), human_bytes(s)))
        .unwrap_or_default();
    let who = proc_of(first.pid)
        .map(|p| p.comm.as_str())
        .unwrap_or(first.comm.as_str());
    let role = match index_of(first.pid) {
        // Consumers open segments; workers make them.
        Some(i) if pytorch && first.kind != FailureKind::Enoent => format!(
            "DataLoader worker {i} ({})",
            shown_pid(first.pid, first.ns_pid, who)
        ),
        _ => match first.ns_pid {
            Some(n) if n != first.pid => format!("pid {n} ({who}, host pid {})", first.pid),
            _ => format!("pid {} ({who})", first.pid),
        },
    };
    let mp = mount
        .and_then(|m| m.mountpoint.clone())
        .unwrap_or_else(|| "/dev/shm".into());
    let ran_out = first.reason.tmpfs_ran_out();
    let mut summary = match first.kind {
        _ if !ran_out && first.kind != FailureKind::OomKill => format!(
            "{role} was the first to fail: {}. /dev/shm did not run out{failed_at}: a bigger one would not help.",
            first.cause
        ),
        FailureKind::Sigbus => format!(
            "{role} was the first to fail: it touched a page of {} that {mp} could not allocate{failed_at}, and the kernel killed it with SIGBUS.",
            first.path.as_deref().unwrap_or("a shared-memory file")
        ),
        FailureKind::OomKill => {
            match first.memcg.as_ref().and_then(|m| Some((m, m.limit_bytes?))) {
                Some((m, limit)) => format!(
                    "{role} was killed by the OOM killer: {} allows {}, and {} of the {} in use was shared memory, which counts against it{}. A bigger /dev/shm would not help.",
                    super::causes::limit_holder(m, "its"),
                    human_bytes(limit),
                    human_bytes(m.shmem_bytes.unwrap_or(0)),
                    human_bytes(m.usage_bytes),
                    super::causes::charged_words(first)
                        .map(|w| format!(" (what filled it: {w})"))
                        .unwrap_or_default()
                ),
                None => format!(
                    "{role} was killed by the OOM killer: its shared memory counts against its memory cgroup's limit."
                ),
            }
        }
        _ => format!(
            "{role} was the first to fail: {}() on {} returned {}{failed_at}.",
            first.syscall.map_or("a syscall", |s| s.name()),
            first.path.as_deref().unwrap_or("a shared-memory file"),
            first
                .errno_name
                .map_or("an error".into(), |e| e.to_string())
        ),
    };
    match r.failures.len() {
        0 | 1 => {}
        2 => summary.push_str(" 1 more failure followed."),
        n => summary.push_str(&format!(" {} more failures followed.", n - 1)),
    }
    let leftovers = describe_leftovers(r, &left, left_bytes);
    if let Some(m) = first.mount.as_ref().and_then(|m| m.used_bytes)
        && left_bytes > 0
    {
        summary.push_str(&format!(
            " {} of the {} in use were files left behind by processes that had exited (see leftovers).",
            human_bytes(left_bytes),
            human_bytes(m)
        ));
    }
    if first.stray_bytes > 0 {
        summary.push_str(&format!(
            " {} of it were files no traced process made (see other files).",
            human_bytes(first.stray_bytes)
        ));
    }
    let memory_limit = memory_headroom(first, recommended);
    let caveat = hoarder(r, user, dataloader_in_flight(r));
    match (recommended, &caveat) {
        (Some(rec), None) => summary.push_str(&format!(
            " A /dev/shm of {} should be enough ({}).",
            human_mib(rec),
            basis.as_deref().unwrap_or("")
        )),
        (Some(rec), Some(_)) => summary.push_str(&format!(
            " A /dev/shm of {} would cover what was asked at that moment; see the caveat.",
            human_mib(rec)
        )),
        (None, _) if left_bytes > 0 && ran_out => {
            summary.push_str(" Removing them is enough: the job fits the /dev/shm it has.")
        }
        _ => {}
    }
    Some(Diagnosis {
        signature,
        framework: user.name().map(String::from),
        summary,
        framework_message,
        framework_misleads,
        recommended_shm_bytes: recommended,
        basis,
        docker: recommended.map(|b| format!("docker run --shm-size={}m ...", b / MIB)),
        kubernetes: recommended.map(|b| kubernetes_snippet(b / MIB)),
        runtime_fix: recommended.and_then(|b| runtime_fix(r.container?, b / MIB)),
        dataloader: fits.filter(|_| ran_out),
        knobs: user.knobs().filter(|_| ran_out).map(String::from),
        leftovers,
        strays: describe_strays(first),
        memory_limit,
        caveat,
        fix: first.fix.clone(),
    })
}

/// A process other than the first to fail that held more than half of the
/// mount's use at the first failure. A DataLoader's main process holding its
/// prefetched batches (up to `in_flight`), and sibling workers of the
/// libraries that share segments between processes, are the design, not a
/// hoard.
fn hoarder(r: &Scope, user: User, in_flight: u64) -> Option<String> {
    let first = r.first_failure?;
    let used = first.mount.as_ref()?.used_bytes?;
    // Never "more than in use" (shared mappings counted in each process;
    // a sixteenth of slack, as the mount's use and the holders' files are
    // read a few pages apart), and not one that failed along with the first
    // (within 10 ms) on segments it mostly shares: a parallel query's
    // workers, which all map the same segments. A consumer keeping what producers send shares
    // those too, so sharing alone does not clear a holder.
    let failed_with_it = |pid: u32| {
        r.failures
            .iter()
            .any(|f| f.pid == pid && f.delay_ns <= 10_000_000)
    };
    let h = first.holders.iter().find(|h| {
        h.pid != first.pid
            && h.held_bytes * 2 > used
            && h.held_bytes <= used + used / 16
            && !(failed_with_it(h.pid) && h.shared_bytes * 2 >= h.held_bytes)
    })?;
    let sibling = r
        .processes
        .iter()
        .any(|p| p.pid == h.pid && p.ppid == first.ppid);
    let parent =
        h.pid == first.ppid && user == User::PytorchDataLoader && h.held_bytes <= in_flight.max(1);
    if parent || (sibling && user.shares_between_siblings()) {
        return None;
    }
    let beyond = match user {
        User::PytorchDataLoader | User::PytorchMultiprocessing if in_flight > 0 => format!(
            " ({:.1}x what a DataLoader with as many workers keeps in flight, {})",
            h.held_bytes as f64 / in_flight as f64,
            human_bytes(in_flight)
        ),
        _ => String::new(),
    };
    let failing = if r.failures.iter().any(|f| f.pid == h.pid) {
        ""
    } else {
        " without failing itself"
    };
    Some(format!(
        "pid {} ({}) held {} of the {} in use{failing}{beyond}: if it keeps every \
         segment it receives, a bigger /dev/shm only postpones the failure, and the job needs \
         what it keeps by its end (--verify tells)",
        h.pid,
        h.comm,
        human_bytes(h.held_bytes.min(used)),
        human_bytes(used)
    ))
}

/// Size estimate: what was in use when it failed plus what the failing
/// processes still wanted; for a PyTorch DataLoader also its steady state,
/// (workers x prefetch_factor + 2) batches in flight. Then 25% headroom,
/// rounded up to 64 MiB.
fn recommend(r: &Scope, pytorch: bool, leftover: u64) -> (Option<u64>, Option<String>) {
    let Some(first) = r.first_failure else {
        return (None, None);
    };
    if first.kind == FailureKind::OomKill {
        return (
            None,
            Some("an OOM kill is a memory cgroup limit, not a /dev/shm size".into()),
        );
    }
    if !first.reason.tmpfs_ran_out() {
        return (
            None,
            Some(format!(
                "not a /dev/shm size: the failure was {}",
                first.reason.name()
            )),
        );
    }
    let m = first.mount.as_ref();
    // What the job itself used: leftover files of exited processes are
    // not its need (removing them is the fix for that part).
    let used = m
        .and_then(|m| m.used_bytes)
        .unwrap_or(0)
        .saturating_sub(leftover);
    let size = m.and_then(|m| m.size_bytes).unwrap_or(0);
    let mut unmet = 0u64;
    let mut seen = std::collections::BTreeSet::new();
    for f in r
        .failures
        .iter()
        .filter(|f| f.reason.tmpfs_ran_out() && seen.insert(f.pid))
    {
        unmet += match (f.kind, f.file_size, f.offset, f.bytes) {
            (FailureKind::Sigbus, Some(sz), Some(off), _) => (sz.max(0) as u64).saturating_sub(off),
            (_, _, _, Some(b)) => b,
            _ => 4096,
        };
    }
    let observed = used + unmet;
    // Largest segment and how many processes created segments.
    let segment = largest_segment(r);
    // Segment makers (not the 32-byte semaphores the main process creates).
    let workers = workers_allocating(r);
    let steady = if pytorch {
        (workers * PREFETCH + 2) * segment
    } else {
        0
    };
    if leftover > 0 && observed.max(steady) + observed.max(steady) / 4 <= size {
        // Without the leftovers the job fits the size it has.
        return (
            None,
            Some(format!(
                "{} in use by the job at the failure + {} it still asked for = {}, which fits \
                 the {} /dev/shm once the {} of leftover files are removed",
                human_bytes(used),
                human_bytes(unmet),
                human_bytes(observed),
                human_bytes(size),
                human_bytes(leftover)
            )),
        );
    }
    let need = if leftover > 0 {
        observed.max(steady)
    } else {
        observed.max(steady).max(size + 4096)
    };
    let with_headroom = need + need / 4;
    let rounded = with_headroom.div_ceil(ROUND) * ROUND;
    let mut basis = format!(
        "{} in use at the failure + {} the failing processes still asked for = {}",
        human_bytes(used),
        human_bytes(unmet),
        human_bytes(observed)
    );
    if leftover > 0 {
        basis.push_str(&format!(
            " (not counting {} of leftover files)",
            human_bytes(leftover)
        ));
    }
    if pytorch && segment > 0 {
        basis.push_str(&format!(
            "; DataLoader steady state ({workers} workers x prefetch_factor {PREFETCH} + 2) x {} batches = {}",
            human_bytes(segment),
            human_bytes(steady)
        ));
    }
    basis.push_str(&format!(
        "; +25% headroom, rounded up to 64 MiB: {}",
        human_mib(rounded)
    ));
    (Some(rounded), Some(basis))
}

#[cfg(test)]
#[path = "diagnosis_tests.rs"]
mod tests;
