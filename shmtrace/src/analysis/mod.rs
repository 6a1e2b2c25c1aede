//! Analysis: from state to an answer. `facts` gathers what state knows at
//! one moment; `diagnosis` reads those facts and says what happened and
//! what fixes it. Output only renders a [`Report`].

pub mod causes;
pub mod diagnosis;
pub mod facts;
#[cfg(test)]
mod golden_tests;
pub mod incident;
mod leftovers;
mod pytorch;
pub mod scope;
mod segments;
pub mod users;
pub mod words;

use serde::Serialize;

pub use self::facts::{Context, Exit, Facts};
use self::{diagnosis::Diagnosis, incident::IncidentReport};
use crate::state::State;

/// The facts and the diagnosis drawn from them.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Report {
    #[serde(flatten)]
    pub facts: Facts,
    /// One per failing mount, in the order of their first failures.
    pub incidents: Vec<IncidentReport>,
    /// The answer: signature, summary, what the framework got wrong, the
    /// /dev/shm size this workload needs. Node-wide: the first incident's.
    pub diagnosis: Option<Diagnosis>,
    /// `run --verify`: the control rerun at the recommended size (null
    /// otherwise, and in the rerun's own report).
    pub verify: Option<Verification>,
}

/// The control rerun of `run --verify` and what it showed.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Verification {
    /// The private /dev/shm size the command was rerun with.
    pub shm_size_bytes: u64,
    /// Whether the rerun had no shared-memory failure.
    pub failure_gone: bool,
    /// The verdict in one sentence.
    pub verdict: String,
    /// The rerun's own report.
    pub rerun: Box<Report>,
}

impl Report {
    pub fn build(st: &State, ctx: Context) -> Self {
        let facts = Facts::gather(st, ctx);
        let incidents = incident::incidents(st, &facts);
        // A job traced on its own is one story; a node has one per mount.
        let diagnosis = if facts.node {
            incidents.first().and_then(|i| i.diagnosis.clone())
        } else {
            diagnosis::diagnose(&scope::Scope::whole(&facts))
        };
        Self {
            facts,
            incidents,
            diagnosis,
            verify: None,
        }
    }
}
