//! Node-wide shmtrace as a DaemonSet runs it, for weeks, beside processes it
//! does not trust: memory bounded under churn, a metrics endpoint that slow
//! or idle clients cannot take down, every way of stopping it ending with
//! its final report.

use std::{
    io::{Read, Write},
    net::TcpStream,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use shmtrace_tests::*;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap()
}

/// SIGKILL on drop, even when the test fails.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        signal(self.0, libc::SIGKILL);
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pid as i32, sig) };
}

/// A job in a private namespace with an 8 MiB /dev/shm that fails for real
/// after some noise; returns its pid (the failing one).
fn failing_job() -> u64 {
    let exe = workload("sigbus_flood");
    let argv = private_shm(
        "size=8m",
        &format!("exec {} /dev/shm 1000 100", exe.display()),
    );
    let out = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
    truth(&String::from_utf8_lossy(&out.stdout))["pid"]
        .as_u64()
        .unwrap()
}

#[test]
fn idle_and_slow_metrics_clients_cannot_stop_scrapes_or_tracing() {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("slow-clients");
    let report = dir.join("r.json");
    let port = 20000 + std::process::id() % 1000;
    let mut cleanup = Cleanup::new(None);
    let mut tracer = start_node_wide(&["--metrics", &format!("127.0.0.1:{port}")], &report);
    cleanup.pids.push(tracer.id());
    let fds_at_start = std::fs::read_dir(format!("/proc/{}/fd", tracer.id()))
        .unwrap()
        .count();

    // 40 connections that never say a word, 8 that start a request and
    // stall (slowloris), 8 that ask and never read the answer.
    let mut held = Vec::new();
    for i in 0..56 {
        let mut s = TcpStream::connect(("127.0.0.1", port as u16)).unwrap();
        if i >= 40 {
            let _ = s.write_all(b"GET /metrics HTTP/1.1\r\n");
        }
        if i >= 48 {
            let _ = s.write_all(b"Host: x\r\n\r\n");
        }
        held.push(s);
    }
    // Tracing goes on meanwhile.
    let pid = failing_job();
    report_until(&report, "the job's failure", |r| {
        r["failures"]
            .as_array()
            .is_some_and(|fs| fs.iter().any(|f| f["pid"].as_u64() == Some(pid)))
    });
    // A real scrape gets through once the stalled ones time out.
    let start = Instant::now();
    let body = http_get(port, "/metrics");
    assert!(body.contains("shmtrace_build_info"), "{body}");
    assert!(
        body.contains("shmtrace_shm_failures_total{reason=\"tmpfs_full\""),
        "{body}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
    // Connections are capped: the stalled ones do not each hold an fd.
    let fds = std::fs::read_dir(format!("/proc/{}/fd", tracer.id()))
        .unwrap()
        .count();
    // At most 16 connections at once, plus the odd fd the host reads hold.
    assert!(
        fds < fds_at_start + 16 + 8,
        "{fds} fds open with 56 stalled clients ({fds_at_start} before)"
    );
    // Only /metrics renders; anything else is answered at once.
    assert_eq!(http_get(port, "/nothing").trim(), "try /metrics");
    let mut s = TcpStream::connect(("127.0.0.1", port as u16)).unwrap();
    s.write_all(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 405"), "{out}");
    drop(held);
    signal(tracer.id(), libc::SIGINT);
    assert!(tracer.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sighup_and_sigterm_end_with_the_final_report() {
    require_root();
    let _lock = bpf_lock(false);
    for sig in [libc::SIGHUP, libc::SIGTERM] {
        let dir = scratch("hup");
        let report = dir.join("r.json");
        let mut cleanup = Cleanup::new(None);
        let mut tracer = start_node_wide(&[], &report);
        cleanup.pids.push(tracer.id());
        let pid = failing_job();
        report_until(&report, "the job's failure", |r| {
            r["failures"]
                .as_array()
                .is_some_and(|fs| fs.iter().any(|f| f["pid"].as_u64() == Some(pid)))
        });
        // The periodic report says "running"; the final one is written on
        // the signal, failure included.
        std::fs::remove_file(&report).unwrap();
        signal(tracer.id(), sig);
        assert!(tracer.wait().unwrap().success(), "signal {sig}");
        let r: Value = read_report(&report);
        assert_eq!(r["mode"], "node");
        assert!(
            r["failures"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["pid"].as_u64() == Some(pid)),
            "signal {sig}: {}",
            r["failures"]
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn churn_of_processes_with_long_command_lines_keeps_memory_bounded() {
    require_root();
    // Alone: the RSS must be this churn's, not other tests'.
    let _lock = bpf_lock(true);
    let dir = scratch("churn");
    let report = dir.join("r.json");
    let mut cleanup = Cleanup::new(None);
    let port = 21000 + std::process::id() % 1000;
    let mut tracer = start_node_wide(&["--metrics", &format!("127.0.0.1:{port}")], &report);
    cleanup.pids.push(tracer.id());
    // Its first tick done: the state of the node as it was.
    report_until(&report, "a first report", |r| r["processes"].is_array());
    let before = rss_kib(tracer.id());
    // A process that lives long enough to be read, with a 64 KiB argument;
    // it opens a tmpfs file (only then is a command line worth reading).
    let mut long = Command::new("sh")
        .args([
            "-c",
            "exec 3>/dev/shm/shmtrace-long-$$ && rm -f /dev/shm/shmtrace-long-$$ && sleep 120",
            "sh",
        ])
        .arg("x".repeat(64 << 10))
        .spawn()
        .unwrap();
    let long_pid = long.id() as u64;
    cleanup.pids.push(long.id());
    // 20,000 processes, each with a 64 KiB command line and a tmpfs file.
    let exe = workload("churn");
    let argv = private_shm(
        "size=64m",
        &format!("exec {} 20000 /dev/shm", exe.display()),
    );
    let churn = Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    cleanup.pids.push(churn.id());
    // Scrapes during the churn: a flood of events must not starve them.
    report_until(&report, "the churn under way", |r| {
        r["processes"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| p["comm"] == "exe"))
    });
    let start = Instant::now();
    let body = http_get(port, "/metrics");
    let took = start.elapsed();
    let out = churn.wait_with_output().unwrap();
    assert_eq!(truth(&String::from_utf8_lossy(&out.stdout))["done"], 20000);
    assert!(
        body.contains("shmtrace_tracked_processes") && took < Duration::from_secs(5),
        "a scrape during the churn took {took:?}: {body}"
    );
    // The backlog applied: two reports in a row (a tick apart) with the
    // same event count.
    let mut last: Option<(f64, u64)> = None;
    report_until(&report, "the churn's events all applied", |r| {
        let (Some(t), Some(n)) = (r["duration_s"].as_f64(), r["events_received"].as_u64()) else {
            return false;
        };
        match last {
            Some((t0, n0)) if t0 != t => {
                last = Some((t, n));
                n0 == n
            }
            Some(_) => false,
            None => {
                last = Some((t, n));
                false
            }
        }
    });
    let after = rss_kib(tracer.id());
    signal(tracer.id(), libc::SIGINT);
    assert!(tracer.wait().unwrap().success());
    let _ = long.kill();
    let _ = long.wait();
    let r: Value = read_report(&report);
    let procs = r["processes"].as_array().unwrap();
    // The churn's children exec'd /proc/self/exe: comm "exe" (other
    // programs re-exec'ing themselves may run on the node meanwhile).
    let churned = procs.iter().filter(|p| p["comm"] == "exe").count();
    assert!(
        churned > 0 && churned <= 2048 + 50,
        "{churned} churn processes kept of 20,000"
    );
    // A process whose fork record was lost to a full ring was never in the
    // state to be dropped: the bound is on what was seen, losses counted.
    let lost = r["lost_events"].as_u64().unwrap();
    let dropped = r["dropped"]["exited_processes"].as_u64().unwrap();
    assert!(
        dropped >= 10_000 && dropped + lost >= 20_000 - 2_048 - 100,
        "{} with {lost} events lost ({})",
        r["dropped"],
        r["lost"]
    );
    assert!(
        procs.len() < 20_000 / 2,
        "{} processes in the report",
        procs.len()
    );
    let long_proc = procs
        .iter()
        .find(|p| p["pid"].as_u64() == Some(long_pid))
        .expect("the long-lived process");
    let cmd = long_proc["cmdline"].as_str().unwrap();
    assert!(
        cmd.len() < 4200 && cmd.ends_with("[cut at 4096 bytes]"),
        "{}",
        &cmd[cmd.len().saturating_sub(40)..]
    );
    assert!(
        after < 96 * 1024 && after.saturating_sub(before) < 48 * 1024,
        "RSS {before} KiB -> {after} KiB after 20,000 processes"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_stuck_fuse_mount_does_not_stop_tracing_or_reports() {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("stuck");
    let report = dir.join("r.json");
    let mut cleanup = Cleanup::new(None);
    let mut tracer = start_node_wide(&[], &report);
    cleanup.pids.push(tracer.id());
    // A FUSE mount that stops answering once the job holds a file on it;
    // the job then maps a tmpfs file (shmtrace looks at its fds: the FUSE
    // one hangs) and fails on its full 8 MiB /dev/shm.
    let exe = workload("stuckfs");
    let (fuse, flag, server) = (dir.join("fuse"), dir.join("stall"), dir.join("server.json"));
    std::fs::create_dir_all(&fuse).unwrap();
    let script = format!(
        "mount -t tmpfs -o size=8m tmpfs /dev/shm && \
         {exe} serve {fuse} {flag} > {server} & \
         while ! test -e {fuse}/file; do sleep 0.05; done; \
         exec {exe} hold {fuse}/file {flag} /dev/shm",
        exe = exe.display(),
        fuse = fuse.display(),
        flag = flag.display(),
        server = server.display()
    );
    let argv = in_private_ns(&script);
    let mut job = Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(job.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let server_pid = truth(&std::fs::read_to_string(&server).unwrap())["server"]
        .as_u64()
        .unwrap() as u32;
    // Whatever happens, the stuck server goes: that frees every process
    // waiting on its mount.
    let _server = KillOnDrop(server_pid);
    let t = truth(&line);
    let pid = t["pid"].as_u64().unwrap();
    cleanup.pids.push(pid as u32);
    assert_eq!(t["fallocate"].as_i64(), Some(libc::ENOSPC as i64), "{t}");
    // The failure is reported while the FUSE server still hangs.
    let r = report_until(&report, "the job's failure despite the stuck mount", |r| {
        r["failures"]
            .as_array()
            .is_some_and(|fs| fs.iter().any(|f| f["pid"].as_u64() == Some(pid)))
            && r["host_reads"]["timed_out"].as_u64() > Some(0)
    });
    assert!(
        r["host_reads"]["timed_out"].as_u64() >= Some(1),
        "{}",
        r["host_reads"]
    );
    // And it still stops on request: the final report is written at once.
    // (A thread stuck in the FUSE request keeps the process from being
    // reaped until the mount answers or goes: no program can undo that.)
    signal(tracer.id(), libc::SIGINT);
    report_until(&report, "the final report", |r| r["mode"] == "node");
    signal(server_pid, libc::SIGKILL);
    signal(pid as u32, libc::SIGKILL);
    let _ = job.wait();
    assert!(tracer.wait().unwrap().success());
    let _ = Command::new("umount").arg("-l").arg(&fuse).status();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn in_a_pid_namespace_of_its_own_it_says_what_it_cannot_see() {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("pidns");
    let report = dir.join("r.json");
    // A container without hostPID: its own PID namespace and /proc.
    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "sh", "-c"])
        .arg(format!(
            "{} --quiet --report {} & p=$!; sleep 3; kill -INT $p; wait $p",
            shmtrace().display(),
            report.display()
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(
        stderr.contains("PID namespace of its own") && stderr.contains("hostPID: true"),
        "{stderr}"
    );
    let r: Value = read_report(&report);
    assert!(
        r["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("not visible")),
        "{}",
        r["notes"]
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn its_own_events_file_on_a_full_tmpfs_neither_feeds_back_nor_loses_the_report() {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("self");
    let tiny = dir.join("tiny");
    std::fs::create_dir_all(&tiny).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&tiny)
        .status()
        .unwrap();
    assert!(st.success());
    let report = dir.join("r.json");
    let events = tiny.join("events.jsonl");
    let mut cleanup = Cleanup::new(None);
    let tracer = start_node_wide(&["--events", events.to_str().unwrap()], &report);
    cleanup.pids.push(tracer.id());
    // Enough events to fill 64 KiB many times over.
    let pid = failing_job();
    for _ in 0..3 {
        failing_job();
    }
    report_until(&report, "the job's failure", |r| {
        r["failures"]
            .as_array()
            .is_some_and(|fs| fs.iter().any(|f| f["pid"].as_u64() == Some(pid)))
    });
    signal(tracer.id(), libc::SIGINT);
    let me = tracer.id() as u64;
    let out = tracer.into_child().wait_with_output().unwrap();
    let _ = Command::new("umount").arg("-l").arg(&tiny).status();
    assert!(out.status.success());
    let r: Value = read_report(&report);
    let fs = r["failures"].as_array().unwrap();
    assert!(
        fs.iter().all(|f| f["pid"].as_u64() != Some(me)),
        "shmtrace reported its own writes: {fs:?}"
    );
    assert!(fs.iter().any(|f| f["pid"].as_u64() == Some(pid)));
    assert!(
        r["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("--events file stopped")),
        "{}",
        r["notes"]
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// GET /metrics with an Accept header: the whole response, head and body.
fn scrape_with_accept(port: u32, accept: &str) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port as u16)).unwrap();
    s.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: {accept}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    // Header names are case-insensitive: compare them in lower case.
    (head.to_ascii_lowercase(), body.to_string())
}

/// `promtool check metrics` on `body`: its complaints, empty when none.
fn promtool_check(body: &str) -> String {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus; scripts/setup.sh --test installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && said.trim().is_empty() {
        String::new()
    } else {
        format!("rc {:?}: {said}", out.status.code())
    }
}

/// The series of a scrape without their values, in order.
fn series(body: &str) -> Vec<&str> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s))
        .collect()
}

#[test]
fn metrics_are_what_prometheus_and_promtool_expect() {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("promtool");
    let report = dir.join("r.json");
    let port = 22000 + std::process::id() % 1000;
    let mut cleanup = Cleanup::new(None);
    // `:PORT`, the usual exporter form: every interface.
    let mut tracer = start_node_wide(&["--metrics", &format!(":{port}")], &report);
    cleanup.pids.push(tracer.id());

    // Before anything of ours failed, the node-level series already exist.
    let before = http_get(port, "/metrics");
    for name in [
        "shmtrace_incidents_total ",
        "shmtrace_incidents_open ",
        "shmtrace_failures_total ",
    ] {
        assert!(
            before.lines().any(|l| l.starts_with(name)),
            "{name}missing before any failure:\n{before}"
        );
    }
    assert_eq!(promtool_check(&before), "", "{before}");

    let pid = failing_job();
    report_until(&report, "the job's failure", |r| {
        r["failures"]
            .as_array()
            .is_some_and(|fs| fs.iter().any(|f| f["pid"].as_u64() == Some(pid)))
    });
    // A plain scrape, as `curl` and Prometheus' text parser take it.
    let (head, body) = scrape_with_accept(port, "*/*");
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    assert!(!body.contains("# EOF"), "{body}");
    assert!(
        body.contains("# TYPE shmtrace_shm_failures_total counter"),
        "{body}"
    );
    assert!(
        body.contains("shmtrace_shm_failures_total{reason=\"tmpfs_full\""),
        "{body}"
    );
    assert_eq!(promtool_check(&body), "", "{body}");
    // Asked for the classic format by name: the same.
    let (head, _) = scrape_with_accept(port, "text/plain;version=0.0.4;q=0.5,*/*;q=0.1");
    assert!(head.contains("version=0.0.4"), "{head}");

    // Asked for OpenMetrics, as Prometheus does when it prefers it.
    let (head, om) = scrape_with_accept(
        port,
        "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    );
    assert!(
        head.contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert!(om.trim_end().ends_with("# EOF"), "{om}");
    assert!(om.contains("# TYPE shmtrace_shm_failures counter"), "{om}");

    // Two scrapes in a row list the same series in the same order (the
    // job is over, so nothing of ours comes or goes between them; others'
    // processes on the node may, so compare only our mount's lines).
    let ours = |b: &str| -> Vec<String> {
        series(b)
            .into_iter()
            .filter(|s| s.starts_with("shmtrace_tmpfs_") || s.starts_with("shmtrace_shm_"))
            .map(str::to_string)
            .collect()
    };
    let a = ours(&http_get(port, "/metrics"));
    let b = ours(&http_get(port, "/metrics"));
    let common: Vec<&String> = a.iter().filter(|s| b.contains(s)).collect();
    let common_b: Vec<&String> = b.iter().filter(|s| a.contains(s)).collect();
    assert_eq!(common, common_b, "series order changed between scrapes");
    assert!(!common.is_empty());

    signal(tracer.id(), libc::SIGINT);
    assert!(tracer.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(dir);
}
