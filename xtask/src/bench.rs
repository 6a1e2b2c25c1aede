//! `cargo xtask bench`: what shmtrace costs the work it watches, as ratios.
//!
//! Three workloads (xtask/bench/*.c), each timed by itself on
//! CLOCK_MONOTONIC, in three conditions interleaved round by round:
//! - base: no shmtrace;
//! - traced: under `shmtrace run` (every hook filters to this process);
//! - bystander: untraced, while shmtrace traces some other process (the
//!   cost every process on the node pays for the enabled tracepoints);
//! - node-wide: while `shmtrace` traces every process (the DaemonSet).
//!
//! The ratio is time(condition) / time(base) per round; the median over
//! rounds is printed. Ratios, never absolute times: machines differ.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, bail};

struct Workload {
    name: &'static str,
    what: &'static str,
    source: &'static str,
    args: &'static [&'static str],
}

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "loader",
        what: "(a) DataLoader-like: 4 workers create, fill, pass by fd, drop 1-32 MiB segments",
        source: "loader.c",
        args: &["48"],
    },
    Workload {
        name: "syscalls",
        what: "(b) open/write/close loop on a non-tmpfs file (600k syscalls)",
        source: "syscalls.c",
        args: &["200000"],
    },
    Workload {
        name: "faults",
        what: "(c) page-fault loop: touch 64 MiB of fresh anonymous memory, 24 times",
        source: "faults.c",
        args: &["24"],
    },
];

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Base = 0,
    Traced = 1,
    Bystander = 2,
    /// shmtrace node-wide (the DaemonSet): every process is traced.
    Node = 3,
}

pub fn run(root: &Path, rounds: usize) -> Result<()> {
    let shmtrace = crate::release_shmtrace(root, "the benchmark")?;
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out)?;
    let mut exes = Vec::new();
    for w in WORKLOADS {
        let exe = out.join(w.name);
        let st = Command::new("gcc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&exe)
            .arg(root.join("xtask/bench").join(w.source))
            .status()
            .context("gcc")?;
        if !st.success() {
            bail!("cannot compile {}", w.source);
        }
        exes.push(exe);
    }

    let modes = [Mode::Base, Mode::Traced, Mode::Bystander, Mode::Node];
    let mut results: Vec<Vec<Vec<f64>>> = WORKLOADS
        .iter()
        .map(|_| vec![vec![]; modes.len()])
        .collect();
    for round in 0..rounds {
        for (i, exe) in exes.iter().enumerate() {
            // Rotate which condition goes first, so drift spreads evenly.
            for k in 0..modes.len() {
                let m = modes[(round + k) % modes.len()];
                let args = WORKLOADS[i].args;
                let t = match m {
                    Mode::Base => time(exe, args, None)?,
                    Mode::Traced => time(exe, args, Some(&shmtrace))?,
                    Mode::Bystander => {
                        let mut idle = Command::new("sleep").arg("100000").spawn()?;
                        let mut by = Command::new(&shmtrace)
                            .args(["--quiet", "--pid", &idle.id().to_string()])
                            .stderr(Stdio::piped())
                            .spawn()?;
                        wait_attached(&mut by)?;
                        let t = time(exe, args, None);
                        let _ = idle.kill();
                        let _ = idle.wait();
                        let _ = by.wait();
                        t?
                    }
                    Mode::Node => {
                        let mut node = Command::new(&shmtrace)
                            .arg("--quiet")
                            .stderr(Stdio::piped())
                            .spawn()?;
                        wait_attached(&mut node)?;
                        let t = time(exe, args, None);
                        // SAFETY: kill(2) of our own child with SIGINT.
                        unsafe { libc_kill(node.id() as i32, 2) };
                        let _ = node.wait();
                        t?
                    }
                };
                results[i][m as usize].push(t);
            }
        }
        eprint!("\rround {}/{rounds}", round + 1);
    }
    eprintln!();

    println!(
        "shmtrace overhead: median of {rounds} interleaved rounds, time ratio to no shmtrace (1.00 = no cost)\n"
    );
    println!("| workload | base (median) | traced | bystander | node-wide |");
    println!("|---|---|---|---|---|");
    for (i, w) in WORKLOADS.iter().enumerate() {
        let base = &results[i][0];
        let ratio = |v: &Vec<f64>| median(v.iter().zip(base).map(|(t, b)| t / b).collect());
        println!(
            "| {} | {:.0} ms | x{:.3} | x{:.3} | x{:.3} |",
            w.what,
            median(base.clone()) / 1e6,
            ratio(&results[i][1]),
            ratio(&results[i][2]),
            ratio(&results[i][3])
        );
    }
    Ok(())
}

fn wait_attached(child: &mut std::process::Child) -> Result<()> {
    use std::io::{BufRead, BufReader};
    let stderr = child.stderr.take().context("stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    for line in lines.by_ref() {
        let line = line?;
        if line.contains("tracing pid") || line.contains("tracing every process") {
            // Keep draining so shmtrace never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            std::thread::sleep(Duration::from_millis(200));
            return Ok(());
        }
    }
    bail!("shmtrace did not attach")
}

/// Runs one workload in a private 512 MiB /dev/shm and returns its own
/// elapsed time in ns.
fn time(exe: &Path, args: &[&str], shmtrace: Option<&Path>) -> Result<f64> {
    let script = format!(
        "mount -t tmpfs -o size=512m tmpfs /dev/shm && exec {} {}",
        exe.display(),
        args.join(" ")
    );
    let mut cmd = match shmtrace {
        Some(s) => {
            let mut c = Command::new(s);
            c.args(["run", "--quiet", "--"]);
            c
        }
        None => Command::new("env"),
    };
    cmd.args([
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
    ]);
    let out = cmd.stderr(Stdio::inherit()).output()?;
    if !out.status.success() {
        bail!("{} failed: {}", exe.display(), out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let ns = text
        .split("\"ns\":")
        .nth(1)
        .and_then(|s| s.split([',', '}']).next())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .with_context(|| format!("no timing from {}: {text}", exe.display()))?;
    Ok(ns)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
