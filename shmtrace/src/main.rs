//! shmtrace: finds which process failed first when shared memory (/dev/shm,
//! tmpfs) ran out, and why. See DESIGN.md for the data flow.

use std::process::ExitCode;

use shmtrace::{
    Fail,
    cli::{self, Cli, Cmd},
    modes::demo,
};

fn main() -> ExitCode {
    let cli = Cli::parse_args();
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
