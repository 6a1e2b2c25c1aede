//! The human summary: a diagnosis first, then the evidence.

use std::fmt::Write as _;

use crate::{
    analysis::{Report, diagnosis::Diagnosis},
    signals,
    state::failures::{Failure, FailureKind, UsageSource},
    units::human_bytes,
};

const MAX_COLLATERAL: usize = 10;

pub fn render(r: &Report) -> String {
    let mut s = String::new();

    let Some(first) = &r.facts.first_failure else {
        let _ = writeln!(
            s,
            "shmtrace: no shared-memory failure seen ({} processes traced, {} events, {:.1}s).",
            r.facts.processes.len(),
            r.facts.events_received,
            r.facts.duration_s
        );
        if !r.facts.other_sigbus.is_empty() {
            let _ = writeln!(
                s,
                "  {} SIGBUS not caused by tmpfs (see the report's other_sigbus).",
                r.facts.other_sigbus.len()
            );
        }
        lost_line(&mut s, r);
        return s;
    };

    let who = |pid: u32, comm: &str| format!("pid {pid} ({comm})");
    let ran_out = |f: &Failure| f.reason.tmpfs_ran_out();
    // Node-wide, each failing mount is its own story: another pod's
    // failures are never this one's collateral.
    if r.facts.node && !r.incidents.is_empty() {
        let n = r.incidents.len();
        let _ = writeln!(
            s,
            "shmtrace: {n} shared-memory incident{}; the first process to fail was {} on {}",
            if n == 1 { "" } else { "s" },
            who(first.pid, &first.comm),
            place(first)
        );
        for i in &r.incidents {
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "incident {} ({}, {} failure{}): {}",
                i.id,
                i.state,
                i.failure_count,
                if i.failure_count == 1 { "" } else { "s" },
                place(&i.first_failure)
            );
            let rest: Vec<&Failure> = i.failures.iter().collect();
            let more = (i.failure_count as usize).saturating_sub(1 + rest.len());
            story(
                &mut s,
                r,
                &i.first_failure,
                &rest,
                more,
                i.diagnosis.as_ref(),
            );
        }
    } else {
        if ran_out(first) {
            let _ = writeln!(
                s,
                "shmtrace: shared memory ran out; the first process to fail was {}",
                who(first.pid, &first.comm)
            );
        } else {
            let _ = writeln!(
                s,
                "shmtrace: a shared-memory call failed, but not for want of /dev/shm space ({}); the first process to fail was {}",
                first.reason.name(),
                who(first.pid, &first.comm)
            );
        }
        let rest: Vec<&Failure> = r.facts.failures.iter().skip(1).collect();
        story(&mut s, r, first, &rest, 0, r.diagnosis.as_ref());
    }
    lost_line(&mut s, r);
    s
}

/// "/dev/shm of podman trainer (mount ns 4026532174)": the mount as the
/// failing process sees it, in its own namespace.
fn place(f: &Failure) -> String {
    let mp = f
        .mount
        .as_ref()
        .and_then(|m| m.mountpoint.as_deref())
        .unwrap_or("(internal shmem)");
    let whose = f
        .container
        .as_ref()
        .filter(|c| c.container_id.is_some() || c.pod_uid.is_some())
        .map(|c| format!(" of {}", c.label()))
        .unwrap_or_default();
    format!("{mp}{whose} (mount ns {})", f.mnt_ns)
}

/// One failing story: its first failure with the evidence, the failures
/// after it (`more` beyond those listed), the diagnosis and the fix.
fn story(
    s: &mut String,
    r: &Report,
    first: &Failure,
    rest: &[&Failure],
    more: usize,
    diagnosis: Option<&Diagnosis>,
) {
    let procs = |pid: u32| r.facts.processes.iter().find(|p| p.pid == pid);
    let who = |pid: u32, comm: &str| format!("pid {pid} ({comm})");
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "  first failure  +{:.6}s  {}",
        first.time_s,
        who(first.pid, &first.comm)
    );
    if let (Some(gap), Some(other)) = (first.tie_ns, first.tie_pid) {
        let comm = procs(other).map(|p| p.comm.as_str()).unwrap_or("?");
        let _ = writeln!(
            s,
            "  tie            {} and {} failed {gap} ns apart, closer than the kernel's clock can order across CPUs: either may have been first",
            who(first.pid, &first.comm),
            who(other, comm)
        );
    }
    if let Some(parent) = first.ancestry.first() {
        let _ = writeln!(s, "  parent         {}", who(parent.pid, &parent.comm));
    }
    let _ = writeln!(s, "  what           {}", what(first));
    let _ = writeln!(s, "  why            {}", first.cause);
    if let Some(l) = &first.limit {
        let _ = writeln!(
            s,
            "  limit          {} = {}{}",
            l.name,
            l.value.map_or("?".into(), |v| v.to_string()),
            l.used.map_or(String::new(), |u| format!(" (in use: {u})"))
        );
    }
    if let Some(m) = &first.mount {
        let mp = m
            .mountpoint
            .clone()
            .unwrap_or_else(|| "(internal shmem)".into());
        match (m.size_bytes, m.used_bytes) {
            (Some(size), Some(used)) if size > 0 => {
                let when = if m.source == UsageSource::Kernel {
                    "at that moment"
                } else {
                    "just after"
                };
                let _ = writeln!(
                    s,
                    "  mount          {mp} (tmpfs {}, mount ns {}): {} of {} used ({:.0}%), {} free {when}",
                    m.dev,
                    first.mnt_ns,
                    human_bytes(used),
                    human_bytes(size),
                    used as f64 * 100.0 / size as f64,
                    human_bytes(size.saturating_sub(used)),
                );
            }
            _ => {
                let _ = writeln!(s, "  mount          {mp} (tmpfs {}): size unknown", m.dev);
            }
        }
    }
    if !first.holders.is_empty() {
        let list: Vec<String> = first
            .holders
            .iter()
            .map(|h| {
                let shared = match h.shared_bytes {
                    0 => String::new(),
                    b if b >= h.held_bytes => " (all shared)".to_string(),
                    b => format!(" ({} shared)", human_bytes(b)),
                };
                format!(
                    "pid {} ({}) {}{shared}",
                    h.pid,
                    h.comm,
                    human_bytes(h.held_bytes)
                )
            })
            .collect();
        let _ = writeln!(s, "  holders        {}", list.join(", "));
        if first.holders.iter().any(|h| h.shared_bytes > 0) {
            let _ = writeln!(
                s,
                "                 (a shared segment counts in each process that maps or opens it)"
            );
        }
    }
    if let Some(p) = procs(first.pid) {
        let fate = match (p.exit_signal, p.exit_code) {
            (Some(sig), _) => format!("killed by {}", signals::describe(sig)),
            (None, Some(code)) => format!("exited with status {code}"),
            _ => "still running when shmtrace stopped".into(),
        };
        let handler = match (p.sigbus_handler_ran, p.sigbus_reraised, p.exit_signal) {
            (true, true, _) => " (its SIGBUS handler ran, then raised the signal again)",
            (true, false, Some(7)) => {
                " (its SIGBUS handler ran and returned; the access faulted again)"
            }
            (true, false, _) => " (a SIGBUS handler caught it)",
            _ => "",
        };
        let _ = writeln!(s, "  then           {fate}{handler}");
    }
    if first.ancestry.len() > 1 {
        let chain: Vec<String> = std::iter::once(format!("{} {}", first.pid, first.comm))
            .chain(
                first
                    .ancestry
                    .iter()
                    .map(|a| format!("{} {}", a.pid, a.comm)),
            )
            .collect();
        let _ = writeln!(s, "  ancestry       {}", chain.join(" <- "));
    }

    if !rest.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "  {} later failure{} (collateral):",
            rest.len(),
            if rest.len() == 1 { "" } else { "s" }
        );
        for f in rest.iter().take(MAX_COLLATERAL) {
            let _ = writeln!(
                s,
                "    +{:>10}  {:<28} {}",
                delay(f.delay_ns),
                who(f.pid, &f.comm),
                what(f)
            );
        }
        if rest.len() + more > MAX_COLLATERAL {
            let _ = writeln!(
                s,
                "    ... and {} more (all in the report)",
                rest.len() + more - MAX_COLLATERAL
            );
        }
    }
    let failed_pids: Vec<u32> = {
        let mut v: Vec<u32> = std::iter::once(first)
            .chain(rest.iter().copied())
            .map(|f| f.pid)
            .collect();
        v.sort();
        v.dedup();
        v
    };
    // A DataLoader names a worker by pid order: said only of a job
    // recognised as one (other programs name whom they name).
    let dataloader = diagnosis.is_some_and(|d| d.signature.starts_with("pytorch-dataloader"));
    if dataloader && failed_pids.len() > 1 && failed_pids[0] != first.pid {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "  note: the lowest failing pid is {}, which is the one a framework that checks workers in \
             pid order (PyTorch's DataLoader) names; it failed {} after pid {}.",
            failed_pids[0],
            delay(
                rest.iter()
                    .find(|f| f.pid == failed_pids[0])
                    .map(|f| f.delay_ns)
                    .unwrap_or(0)
            ),
            first.pid
        );
    }
    if let Some(d) = diagnosis {
        let _ = writeln!(s);
        let _ = writeln!(s, "  diagnosis      [{}] {}", d.signature, d.summary);
        if let Some(m) = &d.framework_message {
            let _ = writeln!(s, "  framework said {m}");
        }
        if let Some(w) = &d.framework_misleads {
            let _ = writeln!(s, "  but            {w}");
        }
        if let Some(b) = d.recommended_shm_bytes {
            let _ = writeln!(
                s,
                "  fix            /dev/shm of {} MiB: {}",
                b >> 20,
                d.basis.as_deref().unwrap_or("")
            );
            // The container's own runtime and name, or its pod: then the
            // other runtimes' spellings are noise.
            let in_pod = first
                .container
                .as_ref()
                .is_some_and(|c| c.pod_uid.is_some());
            match &d.runtime_fix {
                Some(own) => {
                    let key = if in_pod { "pod" } else { "container" };
                    let _ = writeln!(s, "    {key:<12} {own}");
                }
                None => {
                    if let Some(docker) = &d.docker {
                        let _ = writeln!(s, "    docker       {docker}");
                    }
                }
            }
            let _ = writeln!(
                s,
                "    local        shmtrace run --shm-size {}M --verify -- CMD",
                b >> 20
            );
            if let Some(k) = d
                .kubernetes
                .as_ref()
                .filter(|_| d.runtime_fix.is_none() || in_pod)
            {
                let _ = writeln!(s, "    kubernetes   (pod spec)");
                for line in k.lines() {
                    let _ = writeln!(s, "                   {line}");
                }
            }
        }
        if let (None, Some(fix)) = (d.recommended_shm_bytes, &d.fix) {
            let _ = writeln!(s, "  fix            {fix}");
        }
        if let (None, None, Some(_), Some(b)) =
            (d.recommended_shm_bytes, &d.fix, &d.leftovers, &d.basis)
        {
            let _ = writeln!(s, "  fix            remove the leftovers: {b}");
        }
        if let Some(dl) = &d.dataloader {
            let _ = writeln!(s, "    or           {dl}");
        }
        if let Some(k) = &d.knobs {
            let _ = writeln!(s, "    or           {k}");
        }
        if let Some(l) = &d.leftovers {
            let _ = writeln!(s, "  leftovers      {l}");
        }
        if let Some(o) = &d.strays {
            let _ = writeln!(s, "  other files    {o}");
        }
        if let Some(m) = &d.memory_limit {
            let _ = writeln!(s, "  memory limit   {m}");
        }
        if let Some(c) = &d.caveat {
            let _ = writeln!(s, "  caveat         {c}");
        }
    }
    if let Some(f) = Some(first).filter(|f| !f.events_before.is_empty()) {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "  last events on {} before it:",
            f.mount
                .as_ref()
                .and_then(|m| m.mountpoint.clone())
                .unwrap_or_default()
        );
        for e in &f.events_before {
            let _ = writeln!(s, "    {e}");
        }
    }
}

fn lost_line(s: &mut String, r: &Report) {
    for m in r
        .facts
        .mounts
        .iter()
        .filter_map(|m| m.stat.memory_headroom.as_deref())
    {
        let _ = writeln!(s, "  warning        {m}");
    }
    if r.facts.lost_events > 0 {
        let _ = writeln!(
            s,
            "  LOST EVENTS    {} (events ring {}, failures ring {}, children not followed {}): the picture may be incomplete",
            r.facts.lost_events,
            r.facts.lost.events_ring,
            r.facts.lost.failures_ring,
            r.facts.lost.traced_map_full
        );
    } else {
        let _ = writeln!(s, "  lost events    0");
    }
    let held = &r.facts.suppressed;
    if held.failure_records + held.sent_sigbus > 0 {
        let who: Vec<String> = held
            .by_process
            .iter()
            .take(3)
            .map(|p| {
                format!(
                    "pid {}: {} failure records, {} sent SIGBUS",
                    p.pid, p.failure_records, p.sent_sigbus
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "  held back      {} failure records over a process's budget, {} SIGBUS sent by processes ({}); first failures on each mount always pass",
            held.failure_records,
            held.sent_sigbus,
            who.join("; ")
        );
    }
    let d = &r.facts.dropped;
    if d.failures + d.other_sigbus + d.files > 0 {
        let _ = writeln!(
            s,
            "  let go         {} failures, {} kinds of other SIGBUS, {} unheld files over the caps (memory stays bounded; counts are exact)",
            d.failures, d.other_sigbus, d.files
        );
    }
    let stalls = &r.facts.host_reads;
    if stalls.timed_out + stalls.skipped > 0 {
        let _ = writeln!(
            s,
            "  stalled reads  {} reads of /proc, statfs or stat hung and were given up, {} skipped after (a stuck mount or process); tracing went on",
            stalls.timed_out, stalls.skipped
        );
    }
    for n in &r.facts.notes {
        let _ = writeln!(s, "  note: {n}");
    }
}

/// "SIGBUS (BUS_ADRERR) at offset 8.0 MiB of /dev/shm/x, a 4 KiB page"
fn what(f: &Failure) -> String {
    let path = f.path.clone().unwrap_or_else(|| "?".into());
    let deleted = if f.unlinked == Some(true) {
        " (unlinked)"
    } else {
        ""
    };
    match f.kind {
        FailureKind::Sigbus => format!(
            "SIGBUS ({}) on a page of {path}{deleted} at offset {} ({}), address {}",
            f.si_code_name.unwrap_or("?"),
            f.offset.map(human_bytes).unwrap_or("?".into()),
            f.offset.map(|o| o.to_string()).unwrap_or_default(),
            f.fault_addr.map(|a| a.to_string()).unwrap_or_default()
        ),
        FailureKind::OomKill => "killed by the OOM killer".into(),
        FailureKind::CudaIpc => format!("a CUDA IPC call failed: {}", f.cause),
        _ => {
            let sc = f.syscall.map_or("?", |s| s.name());
            let err = format!(
                "{} ({})",
                f.errno_name.map_or("?".into(), |e| e.to_string()),
                signals::errno_text(f.errno.unwrap_or(0))
            );
            match (f.offset, f.bytes) {
                (Some(o), Some(b)) => format!(
                    "{sc}() of {} at offset {} on {path}{deleted}: {err}",
                    human_bytes(b),
                    human_bytes(o)
                ),
                (None, Some(b)) => {
                    format!("{sc}() to {} on {path}{deleted}: {err}", human_bytes(b))
                }
                (Some(o), None) => format!(
                    "{sc}() at offset {} on {path}{deleted}: {err}",
                    human_bytes(o)
                ),
                (None, None) => format!("{sc}() on {path}{deleted}: {err}"),
            }
        }
    }
}

fn delay(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.3}s", ns as f64 / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.3}ms", ns as f64 / 1e6)
    } else {
        format!("{:.1}us", ns as f64 / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use crate::{
        analysis::{Context, Report},
        state::tests::{setup, sigbus_stream},
    };

    #[test]
    fn a_tie_names_both_processes() {
        use crate::{
            event::{Addr, Event, MountPages},
            state::tests::{SHM, file},
        };
        let (mut st, mut host, mut s) = setup();
        let mut map = s.h(11, 10);
        sigbus_stream(&mut st, &mut host, &mut s);
        map.ts_ns = s.h(11, 10).ts_ns;
        st.apply(
            &Event::Mapped {
                h: map,
                addr: Addr(0x7f00_0000_0000),
                len: 8 << 20,
                prot: 3,
                flags: 1,
                offset: 0,
                file: file(100, "torch_12_1", 8 << 20, 0, 16000),
                mountpoint: None,
            },
            &mut host,
        );
        // Pid 11's SIGBUS, stamped 31 ns after pid 12's on another CPU.
        let twelve = st.failures().all()[0].ts_ns;
        let mut h = s.h(11, 10);
        h.ts_ns = twelve + 31;
        st.apply(
            &Event::Sigbus {
                h,
                target: 11,
                target_tid: 11,
                si_code: 2,
                si_errno: 0,
                addr: Addr(0x7f00_0000_2010),
                mount: Some(MountPages {
                    dev: SHM,
                    max_pages: 16384,
                    used_pages: 16384,
                }),
            },
            &mut host,
        );
        let r = Report::build(&st, ctx());
        let first = r.facts.first_failure.as_ref().unwrap();
        assert_eq!(
            (first.pid, first.tie_ns, first.tie_pid),
            (12, Some(31), Some(11))
        );
        let text = super::render(&r);
        assert!(
            text.contains(
                "tie            pid 12 (worker_12) and pid 11 (worker_11) failed 31 ns apart"
            ),
            "{text}"
        );
    }

    fn ctx() -> Context {
        Context {
            mode: "run",
            node: false,
            command: None,
            target_pid: None,
            duration_s: 1.0,
            counters: Default::default(),
            host_stalls: Default::default(),
            exit: None,
            notes: Vec::new(),
        }
    }

    #[test]
    fn the_summary_leads_with_the_first_failure_and_its_evidence() {
        let (mut st, mut host, mut s) = setup();
        sigbus_stream(&mut st, &mut host, &mut s);
        let r = Report::build(
            &st,
            Context {
                counters: crate::capture::Counters {
                    lost: crate::capture::Losses {
                        failures_ring: 2,
                        ..Default::default()
                    },
                    ..Default::default()
                },
                ..ctx()
            },
        );
        let text = super::render(&r);
        let first = text.lines().next().unwrap();
        assert!(
            first.contains("the first process to fail was pid 12"),
            "{text}"
        );
        assert!(
            text.contains("SIGBUS (BUS_ADRERR) on a page of /dev/shm/torch_12_1"),
            "{text}"
        );
        assert!(text.contains("64.0 MiB of 64.0 MiB used (100%)"), "{text}");
        assert!(
            text.contains("diagnosis      [pytorch-dataloader:sigbus]"),
            "{text}"
        );
        assert!(
            text.contains("LOST EVENTS    2 (events ring 0, failures ring 2"),
            "losses are shown: {text}"
        );
    }

    /// Node-wide: two containers' /dev/shm fill 1.5 s apart. Each is its own
    /// incident with its own first failure, collateral and fix.
    #[test]
    fn node_wide_each_incident_is_its_own_story() {
        use crate::{
            event::{Dev, Syscall},
            host::mountinfo::{Mount, Usage},
            state::tests::{Stream, enospc, file},
        };
        let (mut st, mut host, _) = setup();
        let mut s = Stream::new();
        let ids = [
            "1111111111111111111111111111111111111111111111111111111111111111",
            "2222222222222222222222222222222222222222222222222222222222222222",
        ];
        let fail = |st: &mut crate::state::State,
                    host: &mut crate::host::fixture::Fixture,
                    s: &mut Stream,
                    k: usize,
                    pid: u32| {
            let (ns, dev) = (4026532100 + k as u32, Dev(80 + k as u32));
            host.mounts.insert(
                ns,
                vec![Mount {
                    dev,
                    mountpoint: "/dev/shm".into(),
                    fstype: "tmpfs".into(),
                    noexec: false,
                }],
            );
            host.usage.insert(
                dev,
                Usage {
                    size_bytes: 64 << 20,
                    used_bytes: 64 << 20,
                    inodes: 100,
                    inodes_used: 2,
                },
            );
            host.cgroup_ids.insert(
                500 + k as u64,
                format!("/machine.slice/libpod-{}.scope", ids[k]),
            );
            let mut h = s.h(pid, 1);
            (h.mnt_ns, h.cgroup_id) = (ns, 500 + k as u64);
            let seg = crate::event::FileRef {
                dev,
                mount: crate::event::MountPages {
                    dev,
                    ..file(1, "x", 0, 0, 16384).mount
                },
                ..file(7, "batch", 0, 0, 16384)
            };
            st.apply(&enospc(h, Syscall::Write, 3, 1 << 20, seg), host);
        };
        fail(&mut st, &mut host, &mut s, 0, 200);
        fail(&mut st, &mut host, &mut s, 0, 201);
        fail(&mut st, &mut host, &mut s, 1, 300);
        st.tick(&mut host);
        let r = Report::build(
            &st,
            Context {
                mode: "node",
                node: true,
                command: None,
                target_pid: None,
                duration_s: 3.0,
                counters: Default::default(),
                host_stalls: Default::default(),
                exit: None,
                notes: Vec::new(),
            },
        );
        assert_eq!(r.incidents.len(), 2);
        let text = super::render(&r);
        assert!(
            text.starts_with(
                "shmtrace: 2 shared-memory incidents; the first process to fail was pid 200"
            ),
            "{text}"
        );
        let blocks: Vec<&str> = text.split("\nincident ").skip(1).collect();
        assert_eq!(blocks.len(), 2, "{text}");
        assert!(
            blocks[0].contains("/dev/shm of podman 111111111111 (mount ns 4026532100)"),
            "{text}"
        );
        assert!(blocks[0].contains("1 later failure (collateral)"), "{text}");
        assert!(blocks[0].contains("pid 201"), "{text}");
        assert!(
            !blocks[0].contains("pid 300"),
            "collateral crossed mounts: {text}"
        );
        assert!(
            blocks[1].contains("/dev/shm of podman 222222222222"),
            "{text}"
        );
        assert!(
            blocks[1].contains("first failure") && blocks[1].contains("pid 300"),
            "{text}"
        );
        assert!(!blocks[1].contains("collateral"), "{text}");
        for (b, id) in blocks.iter().zip(["111111111111", "222222222222"]) {
            assert!(
                b.contains("    container    podman run --shm-size=128m ...")
                    && b.contains(&format!("(for container {id})"))
                    && !b.contains("docker run")
                    && !b.contains("emptyDir"),
                "the incident's own fix: {text}"
            );
        }
    }
}
