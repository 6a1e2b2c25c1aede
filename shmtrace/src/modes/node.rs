//! Node-wide mode (`shmtrace` with no target): every process on the node,
//! attributed to its container, until Ctrl-C or SIGTERM (the DaemonSet).

use std::time::Duration;

use anyhow::Result;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};

use super::session::{Outputs, Session};
use crate::{
    capture,
    host::procfs::all_pids,
    output::serve::{self, Render},
};

/// The next scrape waiting for metrics, or never when there is no endpoint.
async fn scrape(r: Option<&mut mpsc::Receiver<Render>>) -> Option<Render> {
    match r {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// `ns_grace`: seconds a mount namespace stays anchored after its last
/// process exits (late events there still resolve), then it is let go.
pub async fn node_wide(outputs: Outputs, ns_grace: u64) -> Result<i32> {
    let metrics_addr = outputs.metrics;
    // Before anything slow: a signal that comes while the programs load
    // must end tracing cleanly, not kill shmtrace without its report.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let mut session = Session::start(outputs, true)?;
    session.release_idle_namespaces_after(Duration::from_secs(ns_grace));
    let now = capture::monotonic_ns();
    // Seed from /proc once: who maps or holds tmpfs files right now.
    for pid in all_pids()? {
        if session.add_existing(pid, now, false) {
            session.mark_shm_mapped(pid);
        }
    }
    // Listening before saying so: a scrape right after the line must work.
    let mut scrapes = match &metrics_addr {
        Some(a) => Some(serve::start(a).await?),
        None => None,
    };
    eprintln!("shmtrace: tracing every process on this node; Ctrl-C to stop");
    if let Some(a) = &metrics_addr {
        eprintln!("shmtrace: metrics on http://{a}/metrics");
    }
    let keep = session.outputs().metrics_labels;
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = sighup.recv() => break,
            Some(scrape) = scrape(scrapes.as_mut()) => {
                let body = session.metrics(keep, scrape.format);
                let _ = scrape.reply.send(body);
            }
            _ = session.step(Duration::from_millis(200)) => {}
        }
    }
    session.finish("node", None, None, None).await?;
    Ok(0)
}
