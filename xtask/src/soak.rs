//! `cargo xtask soak`: node-wide shmtrace under churn for N minutes, with
//! its memory and CPU printed over time (as root).
//!
//! What churns, in a loop: short-lived processes with 64 KiB command lines
//! that each create, fill and unlink a tmpfs file (tests/workloads/churn.c);
//! every fifth round a fresh mount namespace with its own 8 MiB /dev/shm
//! (a container's), and in it a process that sends itself SIGBUS in a loop,
//! faults past the end of a file, then fills the tmpfs (a real failure; see
//! tests/workloads/sigbus_flood.c). Namespaces are let go after one second
//! (--ns-grace 1), as a DaemonSet does with finished pods.
//!
//! Printed every --every seconds: shmtrace's RSS and peak RSS, its CPU use
//! over the interval, processes started so far (and per hour), and what its
//! state holds (from its own metrics). The last line is the budget.

use std::{
    io::{Read, Write},
    path::Path,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

const PORT: u16 = 19399;

pub fn run(root: &Path, minutes: f64, every: u64) -> Result<()> {
    let shmtrace = crate::release_shmtrace(root, "the soak")?;
    let out = root.join("target/soak");
    std::fs::create_dir_all(&out)?;
    let mut exes = Vec::new();
    for name in ["churn", "sigbus_flood"] {
        let exe = out.join(name);
        let st = Command::new("gcc")
            .args(["-O1", "-o"])
            .arg(&exe)
            .arg(root.join(format!("tests/workloads/{name}.c")))
            .status()
            .context("gcc")?;
        if !st.success() {
            bail!("cannot compile {name}.c");
        }
        exes.push(exe);
    }
    let (churn, noise) = (exes[0].clone(), exes[1].clone());
    let report = out.join("report.json");
    let mut tracer = Command::new(shmtrace)
        .args(["--quiet", "--ns-grace", "1", "--metrics"])
        .arg(format!("127.0.0.1:{PORT}"))
        .arg("--report")
        .arg(&report)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting shmtrace")?;
    let pid = tracer.id();
    let mut line = [0u8; 256];
    let n = tracer.stderr.as_mut().unwrap().read(&mut line)?;
    if !String::from_utf8_lossy(&line[..n]).contains("tracing every process") {
        let _ = tracer.kill();
        bail!(
            "shmtrace did not start: {}",
            String::from_utf8_lossy(&line[..n])
        );
    }
    let clk = clock_ticks();

    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicU64::new(0));
    let load = {
        let (stop, started) = (stop.clone(), started.clone());
        std::thread::spawn(move || {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let _ = Command::new(&churn)
                    .arg("1000")
                    .arg("/dev/shm")
                    .stdout(Stdio::null())
                    .status();
                started.fetch_add(1001, Ordering::Relaxed);
                if round.is_multiple_of(5) {
                    // A container's /dev/shm, noise in it, then a real failure.
                    let script = format!(
                        "mount -t tmpfs -o size=8m tmpfs /dev/shm && {} 300 /dev/shm && exec {} /dev/shm 20000 2000",
                        churn.display(),
                        noise.display()
                    );
                    let _ = Command::new("unshare")
                        .args(["-m", "--propagation", "private", "sh", "-c", &script])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status();
                    started.fetch_add(306, Ordering::Relaxed);
                }
            }
        })
    };

    println!("shmtrace soak: node-wide shmtrace (pid {pid}) for {minutes} min under churn\n");
    println!(
        "{:>6}  {:>8}  {:>8}  {:>6}  {:>10}  {:>10}  {:>8}  {:>7}",
        "t(s)", "RSS MiB", "peak MiB", "CPU %", "processes", "per hour", "in state", "files"
    );
    let start = Instant::now();
    let (mut last_cpu, mut last_t) = (cpu_ticks(pid).unwrap_or(0), Instant::now());
    let (mut max_rss, mut cpu_sum, mut samples) = (0u64, 0f64, 0u32);
    while start.elapsed().as_secs_f64() < minutes * 60.0 {
        std::thread::sleep(Duration::from_secs(every));
        let (rss, hwm) = memory(pid).context("shmtrace exited")?;
        let cpu = cpu_ticks(pid).unwrap_or(last_cpu);
        let pct = (cpu - last_cpu) as f64 / clk / last_t.elapsed().as_secs_f64() * 100.0;
        (last_cpu, last_t) = (cpu, Instant::now());
        let n = started.load(Ordering::Relaxed);
        let per_hour = n as f64 / start.elapsed().as_secs_f64() * 3600.0;
        let metrics = scrape().unwrap_or_default();
        println!(
            "{:>6.0}  {:>8.1}  {:>8.1}  {:>6.1}  {:>10}  {:>10.0}  {:>8}  {:>7}",
            start.elapsed().as_secs_f64(),
            rss as f64 / 1024.0,
            hwm as f64 / 1024.0,
            pct,
            n,
            per_hour,
            gauge(&metrics, "shmtrace_tracked_processes"),
            gauge(&metrics, "shmtrace_tracked_files"),
        );
        max_rss = max_rss.max(rss);
        cpu_sum += pct;
        samples += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = load.join();
    let peak = memory(pid).map(|(_, h)| h).unwrap_or(0);
    // SIGINT, the way an operator stops it: the final report is written.
    let _ = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status();
    let st = tracer.wait()?;
    let n = started.load(Ordering::Relaxed);
    println!(
        "\nbudget: {} process starts in {:.1} min ({:.0}/hour): RSS at most {:.1} MiB (peak {:.1} MiB), CPU {:.1}% on average; shmtrace exited {}",
        n,
        start.elapsed().as_secs_f64() / 60.0,
        n as f64 / start.elapsed().as_secs_f64() * 3600.0,
        max_rss as f64 / 1024.0,
        peak as f64 / 1024.0,
        cpu_sum / samples.max(1) as f64,
        st
    );
    Ok(())
}

/// (VmRSS, VmHWM) in KiB.
fn memory(pid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |key: &str| -> Option<u64> {
        s.lines()
            .find(|l| l.starts_with(key))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some((kb("VmRSS:")?, kb("VmHWM:")?))
}

/// utime + stime, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn scrape() -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", PORT)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn gauge(metrics: &str, name: &str) -> String {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or("?")
        .to_string()
}
