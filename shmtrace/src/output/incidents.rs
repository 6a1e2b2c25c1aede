//! Durable incidents (`--incidents-dir DIR`): each incident in its own JSON
//! file, named by when it opened and whose it is
//! (`20261203T114822Z-ml-team_trainer-0-3.json`), rewritten while it is
//! open and final once closed; never overwritten by another incident; the
//! oldest files pruned past a bound. One JSON line per incident event
//! (opened, closed) on stdout for log collectors.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result};
use serde_json::json;

use super::files::write_atomic;
use crate::analysis::incident::IncidentReport;

/// Incident files kept in the directory (ours: `*-N.json` we wrote).
pub const KEEP: usize = 500;

pub struct IncidentDir {
    dir: PathBuf,
    /// Each incident's file name, fixed when it opened.
    names: BTreeMap<u64, String>,
    /// Incidents whose final file is written.
    finished: BTreeSet<u64>,
    /// Wall-clock time of shmtrace's start, and CLOCK_MONOTONIC then.
    started: SystemTime,
    /// Give one JSON line per opened/closed incident for stdout.
    log: bool,
}

impl IncidentDir {
    /// Checks that `dir` is a directory we can write (created if missing).
    pub fn open(dir: &Path, log: bool) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create incidents directory {}", dir.display()))?;
        let meta = std::fs::symlink_metadata(dir)
            .with_context(|| format!("cannot read incidents directory {}", dir.display()))?;
        if !meta.is_dir() {
            anyhow::bail!(
                "{} is not a directory (a symlink is refused)",
                dir.display()
            );
        }
        super::files::check_dir(dir)
            .with_context(|| format!("cannot write incidents to {}", dir.display()))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            names: BTreeMap::new(),
            finished: BTreeSet::new(),
            started: SystemTime::now(),
            log,
        })
    }

    /// Writes every incident that changed: open ones each call, closed
    /// ones once more (final), then not again. Returns the log lines for
    /// stdout (one per incident opened or closed), for the caller to print
    /// where they do not land inside the live screen.
    #[must_use]
    pub fn update(&mut self, incidents: &[IncidentReport]) -> Vec<String> {
        let mut lines = Vec::new();
        for i in incidents {
            if self.finished.contains(&i.id) {
                continue;
            }
            let new = !self.names.contains_key(&i.id);
            let name = self
                .names
                .entry(i.id)
                .or_insert_with(|| file_name(self.started, i))
                .clone();
            let path = self.dir.join(&name);
            if new && self.log {
                lines.push(log_line("opened", i, &path));
            }
            let body = match serde_json::to_vec_pretty(i) {
                Ok(b) => b,
                Err(_) => continue,
            };
            if let Err(e) = write_atomic(&path, &body) {
                eprintln!("shmtrace: cannot write incident {}: {e:#}", path.display());
                continue;
            }
            if new {
                self.prune();
            }
            if i.state == "closed" {
                self.finished.insert(i.id);
                if self.log {
                    lines.push(log_line("closed", i, &path));
                }
            }
        }
        lines
    }

    /// Past [`KEEP`] files of ours, the oldest go (names sort by time).
    fn prune(&mut self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut ours: Vec<String> = rd
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with("shm-incident-") && n.ends_with(".json"))
            .collect();
        ours.sort();
        let excess = ours.len().saturating_sub(KEEP);
        for n in ours.into_iter().take(excess) {
            let _ = std::fs::remove_file(self.dir.join(n));
        }
    }
}

/// `shm-incident-<UTC time>-<subject>-<id>.json`: sorts by time; the
/// subject made safe for a file name; the id keeps it unique.
fn file_name(started: SystemTime, i: &IncidentReport) -> String {
    let at = started + Duration::from_secs_f64(i.opened_s.max(0.0));
    let subject: String = i
        .subject()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    format!(
        "shm-incident-{}-{}-{:04}.json",
        utc_stamp(at),
        subject.trim_start_matches('.'),
        i.id
    )
}

/// 20261203T114822Z: RFC 3339 in UTC, without the separators a file name
/// does not need.
fn utc_stamp(t: SystemTime) -> String {
    let t = t.max(UNIX_EPOCH);
    humantime::format_rfc3339_seconds(t)
        .to_string()
        .replace(['-', ':'], "")
}

/// One line for log collectors: what, whose, where, and the answer.
pub fn log_line(event: &str, i: &IncidentReport, path: &Path) -> String {
    let d = i.diagnosis.as_ref();
    json!({
        "type": "incident",
        "msg": format!("shm incident {event}"),
        "event": event,
        "incident": i.id,
        "state": i.state,
        "pod": i.container.as_ref().and_then(|c| c.pod.as_ref()),
        "container": i.container.as_ref().filter(|c| c.container_id.is_some()).map(|c| json!({
            "id": c.container_id, "name": c.name, "runtime": c.runtime,
        })),
        "mount": i.mount.as_ref().and_then(|m| m.mountpoint.clone()),
        "size_bytes": i.mount.as_ref().and_then(|m| m.size_bytes),
        "first_pid": i.first_failure.pid,
        "first_ns_pid": i.first_failure.ns_pid,
        "comm": i.first_failure.comm,
        "kind": i.first_failure.kind,
        "reason": i.first_failure.reason.name(),
        "failures": i.failure_count,
        "signature": d.map(|d| d.signature.clone()),
        "recommended_shm_bytes": d.and_then(|d| d.recommended_shm_bytes),
        "file": path.display().to_string(),
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(UNIX_EPOCH), "19700101T000000Z");
        assert_eq!(
            utc_stamp(UNIX_EPOCH + Duration::from_secs(1_796_298_502)),
            "20261203T114822Z"
        );
        assert_eq!(
            utc_stamp(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "20000229T000000Z"
        );
    }
}
