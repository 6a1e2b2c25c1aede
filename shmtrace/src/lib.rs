//! shmtrace: finds which process failed first when shared memory (/dev/shm,
//! tmpfs) ran out, and why.
//!
//! Data flows one way (see DESIGN.md): `capture` (eBPF programs, rings,
//! decoding into typed `event`s) -> `state` (components fed by events, the
//! machine read only through `host`) -> `analysis` (facts, diagnosis) ->
//! `output` (report, summary, live view, metrics). `modes` wire them up for
//! `run`, `--pid`, node-wide, `demo` and `doctor`.

pub mod analysis;
pub mod capture;
pub mod cli;
pub mod escape;
pub mod event;
pub mod host;
#[cfg(test)]
mod layers_tests;
pub mod modes;
pub mod output;
pub mod signals;
pub mod state;
pub mod units;

/// An error that carries the exit status shmtrace should end with
/// (127 for a command that does not exist, as shells do).
#[derive(Debug)]
pub struct Fail {
    pub code: i32,
    pub message: String,
}

impl Fail {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Fail {}
