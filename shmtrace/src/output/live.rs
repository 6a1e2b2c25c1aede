//! The live view: on a terminal, a top-like screen redrawn once a second
//! (alternate screen, restored at the end); otherwise a plain line per
//! interval at most, and only when something changed. No escape codes
//! unless stderr is a terminal.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{IsTerminal, Write},
    time::Instant,
};

use super::filter::Filter;
use crate::{
    state::{State, containers::Container, failures::Failure, procs::Proc},
    units::human_bytes,
};

const TOP: usize = 8;
const BAR: usize = 24;

pub struct Live {
    tty: bool,
    entered: bool,
    last_line: String,
    started: Instant,
    /// -n/-p/-c: only these pods' and containers' processes, mounts and
    /// failures.
    pub filter: Filter,
    /// -o json: one JSON line per new failure on stdout instead.
    pub json: bool,
    /// Failures already streamed (-o json), by (pid, ts).
    streamed: std::collections::HashSet<(u32, u64)>,
    /// How many failures the state held at the last stream.
    streamed_upto: usize,
}

impl Default for Live {
    fn default() -> Self {
        Self::new()
    }
}

impl Live {
    pub fn new() -> Self {
        Self {
            tty: std::io::stderr().is_terminal(),
            entered: false,
            last_line: String::new(),
            started: Instant::now(),
            filter: Filter::default(),
            json: false,
            streamed: Default::default(),
            streamed_upto: 0,
        }
    }

    pub fn show(&mut self, st: &State, lost: u64) {
        if self.json {
            self.stream(st);
            return;
        }
        let mut err = std::io::stderr().lock();
        if self.tty {
            let screen = self.screen(st, lost);
            let enter = if self.entered { "" } else { "\x1b[?1049h" };
            self.entered = true;
            let _ = write!(err, "{enter}\x1b[H\x1b[2J{screen}");
        } else {
            let line = self.line(st, lost);
            if line != self.last_line {
                let _ = writeln!(err, "{line}");
                self.last_line = line;
            }
        }
        let _ = err.flush();
    }

    /// -o json: new failures stream as soon as they are applied, not at
    /// the next once-a-second refresh (cheap when there are none).
    pub fn failures_applied(&mut self, st: &State) {
        if self.json && st.failures().len() != self.streamed_upto {
            self.streamed_upto = st.failures().len();
            self.stream(st);
        }
    }

    /// -o json: each failure that passes the filter, once, as one line.
    fn stream(&mut self, st: &State) {
        let mut out = std::io::stdout().lock();
        let mut new: Vec<&Failure> = st
            .failures()
            .all()
            .iter()
            .filter(|f| !self.streamed.contains(&(f.pid, f.ts_ns)))
            .filter(|f| self.filter.matches(named(st, f.container.as_ref())))
            .collect();
        new.sort_by_key(|f| f.ts_ns);
        for f in new {
            self.streamed.insert((f.pid, f.ts_ns));
            let mut f = crate::analysis::causes::worded(f);
            if let Some(c) = named(st, f.container.as_ref()) {
                f.container = Some(c.clone());
            }
            if let Ok(line) =
                serde_json::to_string(&serde_json::json!({"type": "failure", "failure": f}))
            {
                let _ = writeln!(out, "{line}");
            }
        }
        let _ = out.flush();
    }

    fn shows(&self, st: &State, p: &Proc) -> bool {
        self.filter.matches(named(st, p.container.as_ref()))
    }

    /// -o json, at the end: one line per incident (each failing mount's own
    /// first failure, collateral, diagnosis and fix), filtered like the
    /// failures.
    pub fn incidents(&mut self, incidents: &[crate::analysis::incident::IncidentReport]) {
        if !self.json {
            return;
        }
        let mut out = std::io::stdout().lock();
        for i in incidents
            .iter()
            .filter(|i| self.filter.matches(i.container.as_ref()))
        {
            if let Ok(line) =
                serde_json::to_string(&serde_json::json!({"type": "incident", "incident": i}))
            {
                let _ = writeln!(out, "{line}");
            }
        }
        let _ = out.flush();
    }

    /// Leaves the alternate screen so the summary lands on the normal one.
    pub fn finish(&mut self) {
        if self.tty && self.entered {
            let _ = write!(std::io::stderr(), "\x1b[?1049l");
            self.entered = false;
        }
    }

    fn line(&self, st: &State, lost: u64) -> String {
        let mut s = format!("shmtrace +{:.0}s", self.started.elapsed().as_secs_f64());
        for m in self.mounts(st) {
            if let (Some(used), Some(size)) = (m.used_bytes, m.size_bytes) {
                let _ = write!(
                    s,
                    " | {} {}/{} ({:.0}%, peak {})",
                    m.mountpoint.as_deref().unwrap_or("?"),
                    human_bytes(used),
                    human_bytes(size),
                    pct(used, size),
                    human_bytes(m.peak_used_bytes)
                );
            }
        }
        if let Some((pid, comm, held)) = self.top_processes(st).into_iter().next() {
            let _ = write!(s, " | top: pid {pid} ({comm}) holds {}", human_bytes(held));
        }
        let _ = write!(s, " | failures {} | lost {}", self.failures(st).len(), lost);
        s
    }

    fn screen(&self, st: &State, lost: u64) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "shmtrace  +{:.0}s  processes {}  events {}  failures {}  lost {}\r",
            self.started.elapsed().as_secs_f64(),
            st.procs().alive().filter(|p| self.shows(st, p)).count(),
            st.evidence().events_seen(),
            self.failures(st).len(),
            lost
        );
        let _ = writeln!(s, "\r\nTMPFS MOUNTS\r");
        let mounts = self.mounts(st);
        if mounts.is_empty() {
            let _ = writeln!(s, "  (none with tracked files yet)\r");
        }
        for m in mounts {
            let (used, size) = (m.used_bytes.unwrap_or(0), m.size_bytes.unwrap_or(0));
            let filled = if size > 0 {
                (used as f64 / size as f64 * BAR as f64).round() as usize
            } else {
                0
            };
            let _ = writeln!(
                s,
                "  {:<24} [{}{}] {:>9} / {:<9} {:>3.0}%  peak {:>9}  tracked {:>9}  ({} ns {})\r",
                m.mountpoint.as_deref().unwrap_or("?"),
                "#".repeat(filled.min(BAR)),
                "-".repeat(BAR - filled.min(BAR)),
                human_bytes(used),
                human_bytes(size),
                pct(used, size),
                human_bytes(m.peak_used_bytes),
                human_bytes(m.tracked_bytes),
                m.dev,
                m.mount_ns
            );
        }
        let containers = self.top_containers(st);
        if containers.len() > 1
            || containers
                .iter()
                .any(|(label, _)| !label.starts_with("host"))
        {
            let _ = writeln!(
                s,
                "\r\nCONTAINERS                                          HELD\r"
            );
            for (label, held) in containers.into_iter().take(TOP) {
                let _ = writeln!(s, "  {label:<48} {:>9}\r", human_bytes(held));
            }
        }
        let _ = writeln!(s, "\r\nPROCESSES            PID       HELD  ALLOCATED\r");
        for (pid, comm, held) in self.top_processes(st).into_iter().take(TOP) {
            let alloc = st.procs().get(pid).map(|p| p.allocated_bytes).unwrap_or(0);
            let _ = writeln!(
                s,
                "  {comm:<16} {pid:>7} {:>10} {:>10}\r",
                human_bytes(held),
                human_bytes(alloc)
            );
        }
        let _ = writeln!(s, "\r\nRECENT FAILURES\r");
        let mut recent = self.failures(st);
        recent.sort_by_key(|f| f.ts_ns);
        if recent.is_empty() {
            let _ = writeln!(s, "  none\r");
        }
        for f in recent.iter().rev().take(5) {
            let _ = writeln!(
                s,
                "  +{:.3}s  pid {} ({})  {}  {}\r",
                f.time_s,
                f.pid,
                f.comm,
                f.kind,
                f.path.as_deref().unwrap_or("")
            );
        }
        let _ = write!(s, "\r\nCtrl-C to stop and write the report\r\n");
        s
    }
}

fn pct(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 * 100.0 / b as f64
    }
}

/// A container as known now (names found after the fact included).
fn named<'a>(st: &'a State, c: Option<&'a Container>) -> Option<&'a Container> {
    c.map(|c| st.containers().by_cgroup(&c.cgroup).unwrap_or(c))
}

impl Live {
    /// Mounts shown: with a filter, those seen from a namespace where a
    /// process that passes it lives (or lived).
    fn mounts<'a>(&self, st: &'a State) -> Vec<&'a crate::state::mount_stats::MountStat> {
        st.mount_stats()
            .all()
            .filter(|m| {
                self.filter.is_empty()
                    || st
                        .procs()
                        .all()
                        .any(|p| p.mnt_ns == m.view_ns && self.shows(st, p))
            })
            .collect()
    }

    fn failures<'a>(&self, st: &'a State) -> Vec<&'a Failure> {
        st.failures()
            .all()
            .iter()
            .filter(|f| self.filter.matches(named(st, f.container.as_ref())))
            .collect()
    }

    /// (pid, comm, held) of live processes holding the most, largest first.
    fn top_processes(&self, st: &State) -> Vec<(u32, String, u64)> {
        let mut v: Vec<(u32, String, u64)> = st
            .procs()
            .alive()
            .filter(|p| p.held_bytes > 0 && self.shows(st, p))
            .map(|p| (p.pid, p.comm.clone(), p.held_bytes))
            .collect();
        v.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
        v
    }

    fn top_containers(&self, st: &State) -> Vec<(String, u64)> {
        let mut by: BTreeMap<String, std::collections::BTreeSet<u32>> = BTreeMap::new();
        for p in st.procs().alive().filter(|p| self.shows(st, p)) {
            if let Some(c) = named(st, p.container.as_ref()) {
                by.entry(c.label()).or_default().insert(p.pid);
            }
        }
        let mut v: Vec<(String, u64)> = by
            .into_iter()
            .map(|(l, pids)| (l, st.files().held_by_any(&pids)))
            .filter(|(_, h)| *h > 0)
            .collect();
        v.sort_by_key(|c| std::cmp::Reverse(c.1));
        v
    }
}
