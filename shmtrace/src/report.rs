//! The JSON report (`--report FILE`): everything the summary says, and the
//! evidence behind it, for machines.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::{
    aggregate::{Aggregator, Failure, MountAtFailure, OtherSignal},
    procs::Proc,
};

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
    pub first_failure: Option<Failure>,
    pub failures: Vec<Failure>,
    pub processes: Vec<Proc>,
    pub mounts: Vec<MountAtFailure>,
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
        Self {
            schema: SCHEMA,
            version: env!("CARGO_PKG_VERSION"),
            mode: ctx.mode,
            command: ctx.command,
            target_pid: ctx.target_pid,
            duration_s: ctx.duration_s,
            first_failure: failures.first().cloned(),
            failures,
            processes: agg.procs.values().cloned().collect(),
            mounts: agg.touched_mounts.values().cloned().collect(),
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
        }
    }

    pub fn write(&self, path: &std::path::Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write report {}", path.display()))
    }
}
