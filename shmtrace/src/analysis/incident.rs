//! Incidents as reported: each failing mount's own first failure, later
//! failures, container and diagnosis (node-wide, where one pod's /dev/shm
//! filling is not collateral of another's).

use serde::Serialize;

use super::{
    diagnosis::{Diagnosis, diagnose},
    facts::Facts,
    scope::Scope,
};
use crate::state::{
    State,
    containers::Container,
    failures::{Failure, MountAtFailure},
};

/// Later failures listed in an incident; the rest are counted.
const MAX_LISTED: usize = 50;

#[derive(Clone, Debug, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct IncidentReport {
    /// The incident's number, from 1, in the order incidents opened.
    pub id: u64,
    /// "open" until `--incident-quiet` passed without a failure, then "closed".
    pub state: &'static str,
    /// Seconds since shmtrace started: first failure, last failure, closing.
    pub opened_s: f64,
    /// When its last failure happened, in seconds since tracing began.
    pub last_failure_s: f64,
    /// When it closed, in seconds since tracing began (null while open).
    pub closed_s: Option<f64>,
    /// The mount as it stood at the incident's first failure.
    pub mount: Option<MountAtFailure>,
    /// The mount namespace of its first failing process.
    pub mount_ns: u32,
    pub container: Option<Container>,
    pub first_failure: Failure,
    /// Failures after the first, in kernel time order (the first 50).
    pub failures: Vec<Failure>,
    /// Failures in all, repeats included.
    pub failure_count: u64,
    pub diagnosis: Option<Diagnosis>,
}

impl IncidentReport {
    /// A name for files and logs: the pod, else the container, else the mount.
    pub fn subject(&self) -> String {
        if let Some(c) = &self.container {
            if let Some(p) = &c.pod {
                return format!("{}_{}", p.namespace, p.name);
            }
            if let Some(n) = &c.name {
                return n.clone();
            }
            if let Some(id) = &c.container_id {
                return id[..id.len().min(12)].to_string();
            }
        }
        match self.mount.as_ref().and_then(|m| m.mountpoint.as_deref()) {
            Some(mp) => mp.trim_start_matches('/').replace('/', "-"),
            None => format!("ns{}", self.mount_ns),
        }
    }
}

/// Every incident state knows of, with its diagnosis.
pub fn incidents(st: &State, facts: &Facts) -> Vec<IncidentReport> {
    st.incidents()
        .all()
        .filter_map(|i| {
            let scope = Scope::incident(facts, i.id);
            let first = scope.first_failure?.clone();
            let diagnosis = diagnose(&scope);
            let failures = scope
                .failures
                .iter()
                .skip(1)
                .take(MAX_LISTED)
                .map(|f| (*f).clone())
                .collect();
            Some(IncidentReport {
                id: i.id,
                state: if i.is_open() { "open" } else { "closed" },
                opened_s: st.since_start(i.first_ns),
                last_failure_s: st.since_start(i.last_ns),
                closed_s: i.closed_ns.map(|t| st.since_start(t)),
                mount: first.mount.clone(),
                mount_ns: i.mnt_ns,
                container: first.container.clone(),
                failures,
                failure_count: i.failures,
                diagnosis,
                first_failure: first,
            })
        })
        .collect()
}
