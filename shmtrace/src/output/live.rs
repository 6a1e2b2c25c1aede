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

use super::{
    filter::Filter,
    fit::{Section, allot, fit, pad},
};
use crate::{
    state::{State, failures::Failure, mount_stats::MountStat, procs::Proc},
    units::human_bytes,
};

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
    /// Log lines held while the screen is drawn on stdout's terminal.
    held: Vec<String>,
    held_dropped: u64,
}

/// Log lines held at most while the screen is up (each a JSON line).
const MAX_HELD: usize = 1000;

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
            held: Vec::new(),
            held_dropped: 0,
        }
    }

    pub fn show(&mut self, st: &State, lost: u64) {
        if self.json {
            self.stream(st);
            return;
        }
        let mut err = std::io::stderr().lock();
        if self.tty {
            let (width, height) = terminal_size().unwrap_or((80, 24));
            let lines = self.screen(st, lost, width, height);
            // Alternate screen and hidden cursor on entry; then each redraw
            // homes, rewrites every line (erasing its rest) and erases what
            // is below: no flicker, and no line ever wraps or scrolls.
            let enter = if self.entered {
                ""
            } else {
                "\x1b[?1049h\x1b[?25l"
            };
            self.entered = true;
            let body = lines.join("\x1b[K\r\n");
            let _ = write!(err, "{enter}\x1b[H{body}\x1b[K\x1b[J");
        } else {
            let line = self.line(st, lost);
            if line != self.last_line {
                let _ = writeln!(err, "{line}");
                self.last_line = line;
            }
        }
        let _ = err.flush();
    }

    /// A log line (an incident opened or closed) for stdout. While the
    /// screen is drawn on a terminal that is also stdout, it would be
    /// written into the screen and erased by the next redraw: it is held
    /// until the screen is left instead (the screen counts them).
    pub fn log(&mut self, line: String) {
        if self.entered && std::io::stdout().is_terminal() {
            if self.held.len() < MAX_HELD {
                self.held.push(line);
            } else {
                self.held_dropped += 1;
            }
            return;
        }
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
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
            .filter(|f| self.filter.matches(st.named(f.container.as_ref())))
            .collect();
        new.sort_by_key(|f| f.ts_ns);
        for f in new {
            self.streamed.insert((f.pid, f.ts_ns));
            let mut f = crate::analysis::causes::worded(f);
            if let Some(c) = st.named(f.container.as_ref()) {
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
        self.filter.matches(st.named(p.container.as_ref()))
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
            let _ = write!(std::io::stderr(), "\x1b[?25h\x1b[?1049l");
            let _ = std::io::stderr().flush();
            self.entered = false;
        }
        let mut out = std::io::stdout().lock();
        for line in self.held.drain(..) {
            let _ = writeln!(out, "{line}");
        }
        if self.held_dropped > 0 {
            let _ = writeln!(
                out,
                "{}",
                serde_json::json!({"type": "log_lines_dropped", "count": self.held_dropped})
            );
            self.held_dropped = 0;
        }
        let _ = out.flush();
    }

    /// In a pipe: one line a second, each mount with its container.
    fn line(&self, st: &State, lost: u64) -> String {
        let mut s = format!("shmtrace +{:.0}s", self.started.elapsed().as_secs_f64());
        for m in self.mounts(st) {
            if let (Some(used), Some(size)) = (m.used_bytes, m.size_bytes) {
                let _ = write!(
                    s,
                    " | {} of {} {}/{} ({:.0}%, peak {}){}",
                    m.mountpoint.as_deref().unwrap_or("?"),
                    mount_owner(st, m),
                    human_bytes(used),
                    human_bytes(size),
                    pct(used, size),
                    human_bytes(m.peak_used_bytes),
                    if failing(st, m) { " FAILED" } else { "" }
                );
            }
        }
        if let Some((pid, comm, held)) = self.top_processes(st).into_iter().next() {
            let _ = write!(s, " | top: pid {pid} ({comm}) holds {}", human_bytes(held));
        }
        let _ = write!(s, " | failures {} | lost {}", self.failures(st).len(), lost);
        s
    }

    /// The screen for a terminal of `width` x `height`: every line fits,
    /// the title and totals always show, and the sections below shrink by
    /// priority (mounts, failing ones first; failures; containers;
    /// processes).
    pub fn screen(&self, st: &State, lost: u64, width: usize, height: usize) -> Vec<String> {
        let mounts = self.mounts(st);
        let failing_mounts = mounts.iter().filter(|m| failing(st, m)).count();
        let failures = self.failures(st);
        let open = st.incidents().all().filter(|i| i.is_open()).count();
        let title = format!(
            "shmtrace  +{:.0}s  processes {}  events {}  failures {}  lost {}",
            self.started.elapsed().as_secs_f64(),
            st.procs().alive().filter(|p| self.shows(st, p)).count(),
            st.evidence().events_seen(),
            failures.len(),
            lost
        );
        let held: u64 = self.top_processes(st).iter().map(|p| p.2).sum();
        let mut totals = format!(
            "tmpfs {} mount{}, {} failing  held {}  incidents {} open / {}",
            mounts.len(),
            if mounts.len() == 1 { "" } else { "s" },
            failing_mounts,
            human_bytes(held),
            open,
            st.incidents().len()
        );
        if !self.held.is_empty() {
            let _ = write!(totals, "  log +{}", self.held.len());
        }
        let mut sections = vec![
            Section {
                title: format!("TMPFS MOUNTS ({})", mounts.len()),
                rows: if mounts.is_empty() {
                    vec!["  (none with tracked files yet)".into()]
                } else {
                    mounts.iter().map(|m| mount_row(st, m, width)).collect()
                },
            },
            Section {
                title: format!("RECENT FAILURES ({})", failures.len()),
                rows: if failures.is_empty() {
                    vec!["  none".into()]
                } else {
                    let mut recent = failures.clone();
                    recent.sort_by_key(|f| std::cmp::Reverse(f.ts_ns));
                    recent.iter().map(|f| failure_row(st, f)).collect()
                },
            },
        ];
        let containers = self.top_containers(st);
        if containers.len() > 1
            || containers
                .iter()
                .any(|(label, _)| !label.starts_with("host"))
        {
            let name_w = width.saturating_sub(14).clamp(10, 60);
            sections.push(Section {
                title: format!("{}  {:>9}", pad("CONTAINERS", name_w + 2), "HELD"),
                rows: containers
                    .into_iter()
                    .map(|(label, held)| {
                        format!("  {}  {:>9}", pad(&label, name_w), human_bytes(held))
                    })
                    .collect(),
            });
        }
        sections.push(Section {
            title: "PROCESSES            PID       HELD  ALLOCATED".into(),
            rows: self
                .top_processes(st)
                .into_iter()
                .map(|(pid, comm, held)| {
                    let alloc = st.procs().get(pid).map(|p| p.allocated_bytes).unwrap_or(0);
                    format!(
                        "  {} {pid:>7} {:>10} {:>10}",
                        pad(&comm, 16),
                        human_bytes(held),
                        human_bytes(alloc)
                    )
                })
                .collect(),
        });
        sections.push(Section {
            title: "Ctrl-C to stop and write the report".into(),
            rows: Vec::new(),
        });
        let mut lines = vec![title, totals];
        lines.extend(allot(&sections, height.saturating_sub(2)));
        lines.truncate(height);
        lines.iter().map(|l| fit(l, width)).collect()
    }
}

/// Whether `m` has had a failure.
fn failing(st: &State, m: &MountStat) -> bool {
    !st.failures().is_first_on(m.dev)
}

/// Who uses mount `m`: the container or pod of a process in the namespace
/// it is shown from, else the host, else that namespace.
fn mount_owner(st: &State, m: &MountStat) -> String {
    match st.mount_container(m.view_ns) {
        // A pod's containers share its /dev/shm: the pod is the owner.
        Some(c) => match &c.pod {
            Some(p) => format!("pod {}/{}", p.namespace, p.name),
            None => c.label(),
        },
        None => namespace_label(st, m.view_ns),
    }
}

/// The host's own mount namespace, or another one by number (a private
/// /dev/shm made with unshare, not a container).
fn namespace_label(st: &State, ns: u32) -> String {
    if ns == st.host_ns() || ns == st.self_ns() {
        "host".into()
    } else {
        format!("mount ns {ns}")
    }
}

/// One mount: marked when it failed, its owner, a bar, its use and peak.
fn mount_row(st: &State, m: &MountStat, width: usize) -> String {
    let (used, size) = (m.used_bytes.unwrap_or(0), m.size_bytes.unwrap_or(0));
    let bar_w = if width >= 120 { BAR } else { 10 };
    let filled = if size > 0 {
        ((used as f64 / size as f64 * bar_w as f64).round() as usize).min(bar_w)
    } else {
        0
    };
    let numbers = format!(
        "[{}{}] {:>9}/{:<9} {:>3.0}%",
        "#".repeat(filled),
        "-".repeat(bar_w - filled),
        human_bytes(used),
        human_bytes(size),
        pct(used, size)
    );
    let peak = if width >= 100 {
        format!("  peak {:>9}", human_bytes(m.peak_used_bytes))
    } else {
        String::new()
    };
    // What is left for the names, the owner taking the slack.
    let fixed = 2 + 1 + numbers.chars().count() + peak.chars().count();
    let names = width.saturating_sub(fixed).max(20);
    let mp_w = (names / 3).clamp(9, 24);
    let owner_w = names.saturating_sub(mp_w + 1);
    format!(
        "{} {} {} {numbers}{peak}",
        if failing(st, m) { "!" } else { " " },
        pad(m.mountpoint.as_deref().unwrap_or("?"), mp_w),
        pad(&mount_owner(st, m), owner_w)
    )
}

/// One failure: when, what, who, on which mount of which container.
fn failure_row(st: &State, f: &Failure) -> String {
    let mount = f
        .mount
        .as_ref()
        .and_then(|m| m.mountpoint.as_deref())
        .unwrap_or("?");
    let owner = match st.named(f.container.as_ref()).filter(|c| c.is_container()) {
        Some(c) => c.label(),
        None => namespace_label(st, f.mnt_ns),
    };
    let what = match f.syscall {
        Some(op) => format!("{} {op}", f.kind),
        None => f.kind.to_string(),
    };
    format!(
        "  +{:.3}s  {what}  pid {} ({})  {mount} of {owner}  {}",
        f.time_s,
        f.pid,
        f.comm,
        f.path.as_deref().unwrap_or("")
    )
}

/// Rows and columns of the terminal on stderr.
fn terminal_size() -> Option<(usize, usize)> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into the struct it is given,
    // which lives for the call.
    let rc = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0 && ws.ws_row > 0).then_some((ws.ws_col as usize, ws.ws_row as usize))
}

fn pct(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 * 100.0 / b as f64
    }
}

impl Live {
    /// Mounts shown: with a filter, those seen from a namespace where a
    /// process that passes it lives (or lived).
    /// Failing mounts first, then the fullest.
    fn mounts<'a>(&self, st: &'a State) -> Vec<&'a MountStat> {
        let mut v: Vec<&MountStat> = st
            .mount_stats()
            .all()
            .filter(|m| {
                self.filter.is_empty()
                    || st
                        .procs()
                        .all()
                        .any(|p| p.mnt_ns == m.view_ns && self.shows(st, p))
            })
            .collect();
        v.sort_by(|a, b| {
            let fill = |m: &MountStat| pct(m.used_bytes.unwrap_or(0), m.size_bytes.unwrap_or(0));
            failing(st, b)
                .cmp(&failing(st, a))
                .then(fill(b).total_cmp(&fill(a)))
                .then(a.dev.cmp(&b.dev))
        });
        v
    }

    fn failures<'a>(&self, st: &'a State) -> Vec<&'a Failure> {
        st.failures()
            .all()
            .iter()
            .filter(|f| self.filter.matches(st.named(f.container.as_ref())))
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
            if let Some(c) = st.named(p.container.as_ref()) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tests::{setup, sigbus_stream};

    #[test]
    fn the_screen_fits_any_terminal_with_title_and_totals_on_top() {
        let (mut st, mut host, mut s) = setup();
        sigbus_stream(&mut st, &mut host, &mut s);
        st.tick(&mut host);
        let live = Live::new();
        for (w, h) in [(80, 24), (120, 30), (40, 10), (20, 3), (200, 60)] {
            let lines = live.screen(&st, 0, w, h);
            assert!(lines.len() <= h, "{w}x{h}: {lines:#?}");
            for l in &lines {
                assert!(l.chars().count() <= w, "{w}x{h}: {l:?} is wider");
            }
            assert!(lines[0].starts_with("shmtrace"), "{lines:#?}");
            assert!(lines[1].starts_with("tmpfs 1 m"), "{lines:#?}");
            if h >= 4 && w >= 40 {
                assert!(
                    lines[1].starts_with("tmpfs 1 mount, 1 failing"),
                    "{lines:#?}"
                );
                assert!(lines[2].starts_with("TMPFS MOUNTS (1)"), "{lines:#?}");
            }
        }
        let lines = live.screen(&st, 0, 80, 24);
        let text = lines.join("\n");
        // The failing mount is marked and named by its owner.
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("! /dev/shm") && l.contains("host")),
            "{text}"
        );
        // The failure names its mount and container (the host here).
        assert!(
            text.contains("sigbus  pid 12 (worker_12)  /dev/shm of host  /dev/shm/torch_12_1"),
            "{text}"
        );
    }

    #[test]
    fn a_pipe_gets_one_line_naming_each_mounts_owner() {
        let (mut st, mut host, mut s) = setup();
        sigbus_stream(&mut st, &mut host, &mut s);
        st.tick(&mut host);
        let line = Live::new().line(&st, 3);
        assert!(
            line.contains("| /dev/shm of host 0 B/64.0 MiB (0%, peak 64.0 MiB) FAILED"),
            "{line}"
        );
        assert!(line.ends_with("| failures 1 | lost 3"), "{line}");
    }
}
