//! `shmtrace --pid PID`: follow a running process and all its descendants,
//! present and future, until they have all exited or Ctrl-C.

use std::time::{Duration, Instant};

use anyhow::Result;
use shmtrace_common::traced;
use tokio::signal::unix::{SignalKind, signal};

use super::session::{Outputs, Session};
use crate::{Fail, capture, host::procfs::descendants};

pub async fn attach(pid: u32, outputs: Outputs) -> Result<i32> {
    if pid == std::process::id() {
        return Err(Fail::new(2, "--pid names shmtrace itself").into());
    }
    if pid == 0 || !alive(pid) {
        return Err(Fail::new(
            1,
            format!("no process with pid {pid} (it may have exited; list candidates with `pgrep -a python`)"),
        )
        .into());
    }
    // Before anything slow: a signal that comes while the programs load
    // must end tracing cleanly, not kill shmtrace without its report.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let mut session = Session::start(outputs, false)?;
    let now = capture::monotonic_ns();
    // Trace the root first so forks from now on are followed by the kernel,
    // then pick up what already exists (twice, to catch forks in between).
    session.trace(pid, traced::REPORT | traced::FOLLOW)?;
    add(&mut session, pid, now, true);
    for _ in 0..2 {
        for d in descendants(pid) {
            if !session.state().procs().contains(d) {
                session.trace(d, traced::REPORT | traced::FOLLOW)?;
                add(&mut session, d, now, false);
            }
        }
    }
    eprintln!(
        "shmtrace: tracing pid {pid} and {} descendant(s); Ctrl-C to stop",
        session.state().procs().len() - 1
    );

    let mut last_check = Instant::now();
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = sighup.recv() => break,
            _ = session.step(Duration::from_millis(100)) => {}
        }
        if last_check.elapsed() >= Duration::from_millis(500) {
            last_check = Instant::now();
            // Exit events say who is gone; /proc confirms (an event can be lost).
            if !session.state().live_pids().into_iter().any(alive) {
                break;
            }
        }
    }
    session.finish("pid", None, Some(pid), None).await?;
    Ok(0)
}

fn add(session: &mut Session, pid: u32, ts: u64, root: bool) {
    if session.add_existing(pid, ts, root) {
        session.mark_shm_mapped(pid);
    }
}

/// Running and not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            s.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next())
                != Some("Z")
        }
        Err(_) => false,
    }
}
