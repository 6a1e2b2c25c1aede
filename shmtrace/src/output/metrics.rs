//! Prometheus metrics for the DaemonSet (`--metrics ADDR`): /dev/shm size,
//! use and peak per mount, bytes held per container, failures and losses.
//! Labels follow the Prometheus naming guide: no pid as a label.

use std::{collections::BTreeMap, fmt::Write as _};

use anyhow::{Context, Result};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

use crate::state::{State, containers::Container};

/// Pod namespace, pod name and container name for a container id, from the
/// kubelet's /var/log/containers/<pod>_<namespace>_<container>-<id>.log
/// links (no API server needed). Re-read on a miss at most every 30 s.
#[derive(Default)]
pub struct PodNames {
    by_id: BTreeMap<String, (String, String, String)>,
    last_read: Option<std::time::Instant>,
}

pub const KUBELET_LOGS: &str = "/var/log/containers";

impl PodNames {
    pub fn lookup(&mut self, id: &str) -> Option<&(String, String, String)> {
        if !self.by_id.contains_key(id)
            && self.last_read.is_none_or(|t| t.elapsed().as_secs() >= 30)
        {
            self.last_read = Some(std::time::Instant::now());
            self.by_id = read_kubelet_logs(std::path::Path::new(KUBELET_LOGS));
        }
        self.by_id.get(id)
    }
}

fn read_kubelet_logs(dir: &std::path::Path) -> BTreeMap<String, (String, String, String)> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".log") else {
            continue;
        };
        // <pod>_<namespace>_<container>-<64 hex>
        let Some((rest, id)) = stem.rsplit_once('-') else {
            continue;
        };
        let mut parts = rest.splitn(3, '_');
        if let (Some(pod), Some(ns), Some(container)) = (parts.next(), parts.next(), parts.next()) {
            out.insert(
                id.to_string(),
                (ns.to_string(), pod.to_string(), container.to_string()),
            );
        }
    }
    out
}

/// The label set of a container: names when the kubelet's logs tell them,
/// else the pod UID and a short container id.
fn labels(c: Option<&Container>, names: &mut PodNames) -> String {
    let Some(c) = c else {
        return r#"namespace="",pod="",container="""#.into();
    };
    if let Some(id) = &c.container_id
        && let Some((ns, pod, container)) = names.lookup(id).cloned()
    {
        return format!(
            r#"namespace="{}",pod="{}",container="{}""#,
            esc(&ns),
            esc(&pod),
            esc(&container)
        );
    }
    format!(
        r#"namespace="",pod="{}",container="{}""#,
        esc(c.pod_uid.as_deref().unwrap_or("")),
        esc(c
            .container_id
            .as_deref()
            .map(|i| &i[..i.len().min(12)])
            .unwrap_or(""))
    )
}

/// Label value escaping (text exposition format).
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub fn render(st: &State, counters: &crate::capture::Counters, names: &mut PodNames) -> String {
    let mut s = String::new();
    let help = |s: &mut String, name: &str, kind: &str, text: &str| {
        let _ = writeln!(s, "# HELP {name} {text}\n# TYPE {name} {kind}");
    };
    help(&mut s, "shmtrace_build_info", "gauge", "shmtrace version.");
    let _ = writeln!(
        s,
        "shmtrace_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );

    // A mount belongs to the container of a live process in its namespace.
    let ns_container: BTreeMap<u32, Option<&Container>> = st
        .procs
        .alive()
        .map(|p| (p.mnt_ns, p.container.as_ref()))
        .collect();
    for (metric, text) in [
        (
            "shmtrace_tmpfs_size_bytes",
            "Size limit of a tmpfs mount (/dev/shm).",
        ),
        (
            "shmtrace_tmpfs_used_bytes",
            "Bytes in use on a tmpfs mount.",
        ),
        (
            "shmtrace_tmpfs_peak_used_bytes",
            "Highest use seen on a tmpfs mount.",
        ),
        (
            "shmtrace_tmpfs_tracked_bytes",
            "Bytes of the tmpfs files shmtrace attributes to processes.",
        ),
    ] {
        help(&mut s, metric, "gauge", text);
        for m in st.mount_stats.by_dev.values() {
            let v = match metric {
                "shmtrace_tmpfs_size_bytes" => m.size_bytes,
                "shmtrace_tmpfs_used_bytes" => m.used_bytes,
                "shmtrace_tmpfs_peak_used_bytes" => Some(m.peak_used_bytes),
                _ => Some(m.tracked_bytes),
            };
            if let Some(v) = v {
                let c = ns_container.get(&m.mount_ns).copied().flatten();
                let _ = writeln!(
                    s,
                    "{metric}{{mountpoint=\"{}\",dev=\"{}\",{}}} {v}",
                    esc(m.mountpoint.as_deref().unwrap_or("")),
                    m.dev,
                    labels(c, names)
                );
            }
        }
    }

    help(
        &mut s,
        "shmtrace_container_shm_held_bytes",
        "gauge",
        "Bytes of tmpfs files a container's processes keep alive (each file once).",
    );
    let mut by_container: BTreeMap<String, (Option<&Container>, std::collections::BTreeSet<u32>)> =
        BTreeMap::new();
    for p in st.procs.alive() {
        let key = p
            .container
            .as_ref()
            .map(|c| c.cgroup.clone())
            .unwrap_or_default();
        by_container
            .entry(key)
            .or_insert((p.container.as_ref(), Default::default()))
            .1
            .insert(p.pid);
    }
    for (c, pids) in by_container.values() {
        let held = st.files.held_by_any(pids);
        if held > 0 {
            let _ = writeln!(
                s,
                "shmtrace_container_shm_held_bytes{{{}}} {held}",
                labels(*c, names)
            );
        }
    }

    help(
        &mut s,
        "shmtrace_shm_failures_total",
        "counter",
        "Shared-memory failures seen, by kind.",
    );
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    for f in st.failures.all() {
        *failures
            .entry(format!(
                "reason=\"{}\",{}",
                f.kind,
                labels(f.container.as_ref(), names)
            ))
            .or_default() += 1;
    }
    for (l, n) in failures {
        let _ = writeln!(s, "shmtrace_shm_failures_total{{{l}}} {n}");
    }

    help(
        &mut s,
        "shmtrace_events_lost_total",
        "counter",
        "Kernel events lost, by stage.",
    );
    let l = &counters.lost;
    for (stage, n) in [
        ("events_ring", l.events_ring),
        ("failures_ring", l.failures_ring),
        ("traced_map_full", l.traced_map_full),
    ] {
        let _ = writeln!(s, "shmtrace_events_lost_total{{stage=\"{stage}\"}} {n}");
    }
    help(
        &mut s,
        "shmtrace_events_total",
        "counter",
        "Kernel events received.",
    );
    let _ = writeln!(s, "shmtrace_events_total {}", st.evidence.events_seen);
    s
}

pub async fn bind(addr: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for metrics on {addr}"))
}

/// Answers one HTTP request: /metrics with `body`, /healthz with "ok".
pub async fn answer(mut stream: tokio::net::TcpStream, body: String) {
    // The request line may arrive in pieces: read up to the end of the
    // headers (or 2 s, or 4 KiB).
    let mut buf = Vec::with_capacity(1024);
    let read_head = async {
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 4096 {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    if tokio::time::timeout(std::time::Duration::from_secs(2), read_head)
        .await
        .is_err()
        || buf.is_empty()
    {
        return;
    }
    let req = String::from_utf8_lossy(&buf);
    let path = req.split_whitespace().nth(1).unwrap_or("/");
    let (status, ctype, body) = match path {
        "/metrics" => ("200 OK", "text/plain; version=0.0.4", body),
        "/healthz" | "/readyz" => ("200 OK", "text/plain", "ok\n".to_string()),
        _ => ("404 Not Found", "text/plain", "try /metrics\n".to_string()),
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(resp.as_bytes()).await;
}
