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
    aggregate::Aggregator,
    report::{self, Report},
    summary,
    tracer::{self, Tracer},
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
    pub metrics: Option<String>,
}

pub struct Session {
    pub tracer: Tracer,
    pub agg: Aggregator,
    events_out: Option<BufWriter<File>>,
    outputs: Outputs,
    start_ns: u64,
    last_tick: std::time::Instant,
    live: Option<crate::live::Live>,
}

impl Session {
    pub fn start(outputs: Outputs, all_processes: bool) -> Result<Self> {
        // Open outputs first: a typo in a path should fail before tracing.
        let events_out = match &outputs.events {
            Some(p) => Some(BufWriter::new(File::create(p).with_context(|| {
                format!("cannot create events file {}", p.display())
            })?)),
            None => None,
        };
        if let Some(p) = &outputs.report {
            File::create(p)
                .with_context(|| format!("cannot create report file {}", p.display()))?;
        }
        let tracer = Tracer::start(all_processes, outputs.events_ring)?;
        let start_ns = tracer::monotonic_ns();
        for n in &tracer.notes {
            eprintln!("shmtrace: note: {n}");
        }
        let live = (outputs.live && !outputs.quiet).then(crate::live::Live::new);
        Ok(Self {
            tracer,
            agg: Aggregator::new(start_ns),
            events_out,
            outputs,
            start_ns,
            last_tick: std::time::Instant::now(),
            live,
        })
    }

    /// Moves every event that is safe to order into the aggregator.
    pub fn pump(&mut self, flush: bool) {
        for ev in self.tracer.drain(flush) {
            if let Some(out) = &mut self.events_out {
                let line = crate::events::to_json(&ev, self.start_ns);
                let _ = writeln!(out, "{line}");
            }
            self.agg.apply(&ev);
        }
    }

    /// Waits for events (or `tick`) and applies them; once a second,
    /// refreshes attribution and rewrites the report file.
    pub async fn step(&mut self, tick: Duration) {
        self.tracer.wait(tick).await;
        self.pump(false);
        if self.last_tick.elapsed() >= Duration::from_secs(1) {
            self.last_tick = std::time::Instant::now();
            self.agg.tick();
            if let Some(p) = &self.outputs.report {
                let _ = self.snapshot("running", None, None, None).write(p);
            }
            if let Some(live) = &mut self.live {
                live.show(&self.agg, self.tracer.lost());
            }
        }
    }

    /// The report as it stands now.
    pub fn snapshot(
        &self,
        mode: &'static str,
        command: Option<Vec<String>>,
        target_pid: Option<u32>,
        exit: Option<report::Exit>,
    ) -> Report {
        Report::build(
            &self.agg,
            report::Context_ {
                mode,
                command,
                target_pid,
                duration_s: (tracer::monotonic_ns() - self.start_ns) as f64 / 1e9,
                lost: self.tracer.lost(),
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
        exit: Option<report::Exit>,
    ) -> Result<Report> {
        // Events of the last moments may still be in the rings.
        tokio::time::sleep(Duration::from_millis(30)).await;
        self.pump(true);
        if let Some(out) = &mut self.events_out {
            out.flush().context("cannot write events file")?;
        }
        self.agg.tick();
        if let Some(live) = &mut self.live {
            live.finish();
        }
        let report = self.snapshot(mode, command, target_pid, exit);
        if let Some(p) = &self.outputs.report {
            report.write(p)?;
        }
        if !self.outputs.quiet {
            eprint!("{}", summary::render(&report));
            if let Some(p) = &self.outputs.report {
                eprintln!("  report         {}", p.display());
            }
        }
        Ok(report)
    }
}
