//! One tracing session: the tracer feeding the aggregator, the `--events`
//! stream, and the report and summary at the end. `run`, `--pid` and `demo`
//! differ only in how they pick processes and when they stop.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::PathBuf,
    time::Duration,
};

use anyhow::{Context, Result};

use crate::{
    analysis::{self, Report},
    capture::{self, Tracer},
    host::Host as _,
    host::ProcHost,
    output::{self, live::Live, summary},
    state::State,
};

/// Where results go.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    pub report: Option<PathBuf>,
    pub events: Option<PathBuf>,
    pub quiet: bool,
    /// Bytes of the ordinary events ring buffer (None: the built-in 4 MiB).
    pub events_ring: Option<u32>,
    /// Show the live view (top-like on a terminal, a line a second otherwise).
    pub live: bool,
    /// Serve Prometheus metrics on this address (node-wide mode).
    pub metrics: Option<std::net::SocketAddr>,
    /// Write each incident to its own JSON file here.
    pub incidents_dir: Option<PathBuf>,
    /// An incident closes after this long without a failure on its mount.
    pub incident_quiet: Duration,
    /// Identity labels on metrics series.
    pub metrics_labels: output::metrics::LabelSet,
    /// -n/-p/-c: what the live stream shows.
    pub filter: output::filter::Filter,
    /// -o json: the live stream as JSON lines on stdout.
    pub json: bool,
}

pub struct Session {
    tracer: Tracer,
    state: State,
    host: ProcHost,
    events_out: Option<BufWriter<File>>,
    outputs: Outputs,
    start_ns: u64,
    last_tick: std::time::Instant,
    /// Which CUDA libraries get the CUDA IPC uretprobes.
    cuda: super::cuda::CudaWatch,
    live: Option<Live>,
    /// Node-wide (one diagnosis per incident) or one job.
    node: bool,
    incidents: Option<output::incidents::IncidentDir>,
}

impl Session {
    pub fn start(outputs: Outputs, all_processes: bool) -> Result<Self> {
        // Open outputs first: a typo in a path should fail before tracing.
        if let Some(p) = &outputs.report {
            output::files::check_target(p)
                .with_context(|| format!("cannot create report file {}", p.display()))?;
        }
        let incidents = match &outputs.incidents_dir {
            Some(d) => Some(output::incidents::IncidentDir::open(d, all_processes)?),
            None => None,
        };
        // Created last: nothing is left behind when an earlier check fails.
        let events_out = match &outputs.events {
            Some(p) => Some(BufWriter::new(
                output::files::create_stream(p)
                    .with_context(|| format!("cannot create events file {}", p.display()))?,
            )),
            None => None,
        };
        let tracer = Tracer::start(all_processes, outputs.events_ring)?;
        let start_ns = capture::monotonic_ns();
        for n in &tracer.notes {
            eprintln!("shmtrace: note: {n}");
        }
        let live = (outputs.json || (outputs.live && !outputs.quiet)).then(|| {
            let mut l = Live::new();
            l.filter = outputs.filter.clone();
            l.json = outputs.json;
            l
        });
        let mut host = ProcHost::new();
        let mut state = State::new(start_ns, &mut host);
        if all_processes {
            state.read_lazily_at_exec();
        }
        Ok(Self {
            tracer,
            state,
            host,
            events_out,
            outputs,
            start_ns,
            last_tick: std::time::Instant::now(),
            cuda: Default::default(),
            live,
            node: all_processes,
            incidents,
        })
    }

    pub fn outputs(&self) -> &Outputs {
        &self.outputs
    }

    /// Registers a process that exists already (see [`State::add_existing`]).
    pub fn add_existing(&mut self, pid: u32, ts: u64, root: bool) -> bool {
        self.state.add_existing(&mut self.host, pid, ts, root)
    }

    /// Registers the command `run` started (see [`State::add_started`]).
    pub fn add_started(&mut self, pid: u32, ts: u64, command: &[String]) {
        let comm: String = command
            .first()
            .map(|p| p.rsplit('/').next().unwrap_or(p).chars().take(15).collect())
            .unwrap_or_default();
        let cmdline = command
            .iter()
            .map(|a| {
                let s = crate::escape::str(a);
                if s.contains(' ') { format!("'{s}'") } else { s }
            })
            .collect::<Vec<_>>()
            .join(" ");
        let ns = self.host.self_ns();
        self.state
            .add_started(pid, ts, &crate::escape::str(&comm), cmdline, ns);
    }

    /// The --events file cannot take more (its disk is full, say): stop
    /// writing it, say so, and lose nothing else.
    fn events_failed(&mut self, e: std::io::Error) {
        self.events_out = None;
        let note = format!(
            "the --events file stopped after {} events: {e}; the report is complete",
            self.state.evidence().events_seen()
        );
        eprintln!("shmtrace: {note}");
        self.tracer.notes.push(note);
    }

    /// Moves every event that is safe to order into the state.
    pub fn pump(&mut self, flush: bool) {
        let evs = self.tracer.drain(flush);
        self.state.prepare(&evs, &mut self.host);
        for ev in evs {
            if let Some(out) = &mut self.events_out {
                let line = output::events::to_json(&ev, self.start_ns);
                if let Err(e) = writeln!(out, "{line}") {
                    self.events_failed(e);
                }
            }
            self.state.apply(&ev, &mut self.host);
        }
        self.sync_namespaces();
    }

    /// Tells the kernel side which mount namespaces are anchored by now.
    fn sync_namespaces(&mut self) {
        // Namespaces anchored by now: their execs need not wake us.
        let mut known = self.host.anchored();
        known.push(self.host.self_ns());
        self.tracer.mark_known_namespaces(&known);
    }

    /// Waits for events (or `tick`) and applies them; once a second,
    /// refreshes attribution and rewrites the report file.
    pub async fn step(&mut self, tick: Duration) {
        // Under a steady flood the rings are always ready and this future
        // would never yield: let the runtime's other tasks (the metrics
        // endpoint, signals) run between batches. Before waiting, so a
        // caller's select! that drops this future loses no readiness.
        tokio::task::yield_now().await;
        self.tracer.wait(tick).await;
        self.pump(false);
        self.state.settle(&mut self.host, capture::monotonic_ns());
        if let Some(live) = &mut self.live {
            live.failures_applied(&self.state);
        }
        if self.last_tick.elapsed() >= Duration::from_secs(1) {
            self.last_tick = std::time::Instant::now();
            self.state.tick(&mut self.host);
            self.sync_namespaces();
            self.find_cuda();
            let quiet = self.outputs.incident_quiet.as_nanos() as u64;
            self.state
                .close_quiet_incidents(capture::monotonic_ns(), quiet.max(1));
            let mode = if self.node { "node" } else { "running" };
            if self.outputs.report.is_some() || self.incidents.is_some() {
                let r = self.snapshot(mode, None, None, None);
                if let Some(p) = &self.outputs.report {
                    let _ = output::report::write(&r, p);
                }
                if let Some(d) = &mut self.incidents {
                    let lines = d.update(&r.incidents);
                    self.log(lines);
                }
            }
            if let Some(live) = &mut self.live {
                live.show(&self.state, self.tracer.lost_total());
            }
        }
    }

    /// Log lines for stdout: through the live view, which holds them while
    /// its screen is up on the same terminal.
    fn log(&mut self, lines: Vec<String>) {
        for line in lines {
            match &mut self.live {
                Some(live) => live.log(line),
                None => println!("{line}"),
            }
        }
    }

    fn find_cuda(&mut self) {
        let pids = if self.node {
            self.state.shm_users()
        } else {
            self.state.live_pids()
        };
        self.cuda.look(pids, &self.host, &mut self.tracer);
    }

    /// Traces `pid` (see `traced` flags in shmtrace-common).
    pub fn trace(&mut self, pid: u32, flags: u32) -> Result<()> {
        self.tracer.trace(pid, flags)
    }

    pub fn untrace(&mut self, pid: u32) {
        self.tracer.untrace(pid);
    }

    /// `pid` maps tmpfs already: its mmaps and closes matter from now.
    pub fn mark_shm_mapped(&mut self, pid: u32) {
        self.tracer.mark_shm_mapped(pid);
    }

    /// What state knows now.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The metrics page as it stands now.
    pub fn metrics(
        &self,
        keep: output::metrics::LabelSet,
        format: output::metrics::Format,
    ) -> String {
        output::metrics::render(&self.state, &self.tracer.counters(), keep, format)
    }

    /// Node-wide: see [`State::release_idle_namespaces_after`].
    pub fn release_idle_namespaces_after(&mut self, grace: Duration) {
        self.state.release_idle_namespaces_after(grace);
    }

    /// The report as it stands now.
    pub fn snapshot(
        &self,
        mode: &'static str,
        command: Option<Vec<String>>,
        target_pid: Option<u32>,
        exit: Option<analysis::Exit>,
    ) -> Report {
        Report::build(
            &self.state,
            analysis::Context {
                mode,
                node: self.node,
                command,
                target_pid,
                duration_s: (capture::monotonic_ns() - self.start_ns) as f64 / 1e9,
                counters: self.tracer.counters(),
                host_stalls: self.host.stalls(),
                exit,
                notes: self.tracer.notes.clone(),
            },
        )
    }

    /// Reads what is still in flight, then writes the report and summary.
    pub async fn finish(
        mut self,
        mode: &'static str,
        command: Option<Vec<String>>,
        target_pid: Option<u32>,
        exit: Option<analysis::Exit>,
    ) -> Result<Report> {
        // Events of the last moments may still be in the rings.
        tokio::time::sleep(Duration::from_millis(30)).await;
        self.pump(true);
        self.state.settle(&mut self.host, u64::MAX);
        if let Some(out) = &mut self.events_out
            && let Err(e) = out.flush()
        {
            self.events_failed(e);
        }
        self.state.tick(&mut self.host);
        // Ending: every incident is final.
        self.state.close_incidents(capture::monotonic_ns());
        if let Some(live) = &mut self.live {
            live.finish();
        }
        let report = self.snapshot(mode, command, target_pid, exit);
        if let Some(live) = &mut self.live {
            live.incidents(&report.incidents);
        }
        // A report that cannot be written loses nothing else: the summary
        // is printed (even with --quiet) and the job's status kept.
        let written = self
            .outputs
            .report
            .as_ref()
            .map(|p| (p, output::report::write(&report, p)));
        if let Some(d) = &mut self.incidents {
            // The screen is left: straight to stdout.
            for line in d.update(&report.incidents) {
                println!("{line}");
            }
        }
        let failed = matches!(written, Some((_, Err(_))));
        if !self.outputs.quiet || failed {
            eprint!("{}", summary::render(&report));
        }
        match written {
            Some((p, Ok(()))) if !self.outputs.quiet => {
                eprintln!("  report         {}", p.display())
            }
            Some((p, Err(e))) => output::report::say_unwritten(p, &e),
            _ => {}
        }
        Ok(report)
    }
}
