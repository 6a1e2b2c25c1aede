//! Analysis: from state to an answer. `facts` gathers what state knows at
//! one moment; `diagnosis` reads those facts and says what happened and
//! what fixes it. Output only renders a [`Report`].

pub mod diagnosis;
pub mod facts;

use serde::Serialize;

use self::diagnosis::Diagnosis;
pub use self::facts::{Context, Exit, Facts};
use crate::state::State;

/// The facts and the diagnosis drawn from them.
#[derive(Serialize)]
pub struct Report {
    #[serde(flatten)]
    pub facts: Facts,
    /// The answer: signature, summary, what the framework got wrong, the
    /// /dev/shm size this workload needs.
    pub diagnosis: Option<Diagnosis>,
}

impl Report {
    pub fn build(st: &State, ctx: Context) -> Self {
        let facts = Facts::gather(st, ctx);
        let diagnosis = diagnosis::diagnose(&facts);
        Self { facts, diagnosis }
    }
}

impl std::ops::Deref for Report {
    type Target = Facts;

    fn deref(&self) -> &Facts {
        &self.facts
    }
}
