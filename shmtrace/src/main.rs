//! shmtrace: finds which process failed first when shared memory (/dev/shm,
//! tmpfs) ran out, and why. See DESIGN.md for the data flow.

mod aggregate;
mod attach;
mod attribution;
mod btf;
mod cli;
mod containers;
mod demo;
mod diagnosis;
mod doctor;
mod escape;
mod events;
mod live;
mod metrics;
mod mounts;
mod node;
mod offsets;
mod preflight;
mod procs;
mod report;
mod run;
mod session;
mod signals;
mod summary;
mod tracer;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Cmd};

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

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo's workload runs without tracing or a runtime of its own.
    if let Some(Cmd::DemoWorkload { workers, batch_mib }) = &cli.command {
        let w = demo::Workload {
            workers: *workers,
            batch_bytes: batch_mib << 20,
        };
        return exit(demo::trainer(w));
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return exit(Err(e.into())),
    };
    exit(rt.block_on(cli::dispatch(cli)))
}

fn exit(r: anyhow::Result<i32>) -> ExitCode {
    match r {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            let code = e.downcast_ref::<Fail>().map(|f| f.code).unwrap_or(1);
            eprintln!("shmtrace: error: {e:#}");
            ExitCode::from(code.clamp(1, 255) as u8)
        }
    }
}
