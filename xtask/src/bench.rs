//! `cargo xtask bench`: what shmtrace costs the work it watches, as ratios
//! to the same work without it, from one run with interleaved repetitions.
//! One file on purpose: one run, its conditions, workloads and extra
//! measurements, read top to bottom like the table it prints.
//!
//! Conditions, rotated round by round so that drift spreads evenly:
//! - base: nothing attached;
//! - floor: one bpftrace program on a syscall tracepoint that never fires
//!   (sys_exit_acct): enabling any syscall tracepoint puts every syscall
//!   of every process on the kernel's slow path, so no syscall tracer can
//!   cost less;
//! - node-wide: `shmtrace` tracing every process (the DaemonSet);
//! - --pid: `shmtrace --pid` tracing another process (the workload pays
//!   only for being on the same node);
//! - run: the workload itself traced by `shmtrace run`;
//! - bpftrace: a peer one-liner on the same syscall exits, counting
//!   failures per process;
//! - optionally `--compare BIN`: another shmtrace build, node-wide.
//!
//! Workloads (xtask/bench/): an open/read/close loop, the everyday syscalls
//! of processes that never touch /dev/shm (writes, fcntl, log appends,
//! anonymous mmap, sockets, dup; everyday.c), a DataLoader-like shm
//! workload in C, and one epoch of a real PyTorch DataLoader (skipped when
//! python3 cannot import torch). Each prints its time and the time of a
//! fixed amount of pure CPU work done around it (syscalls.c: after each of
//! its 100 chunks); the ratios are of the two, so that a small shared VM
//! slowing down as a whole cancels out. Then, node-wide: attach time, the time
//! from a failing syscall to its JSON line, the tmpfs event rate at which
//! the ring starts to lose events, and shmtrace's peak RSS.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

struct Workload {
    name: &'static str,
    what: &'static str,
    /// A C source in xtask/bench, or a Python script run with python3.
    source: &'static str,
    args: &'static [&'static str],
    /// Runs on the last CPU alone (a single-threaded loop: fewer
    /// migrations, less noise), the tracers' user space elsewhere.
    pin: bool,
    /// Runs per condition and round (their median counts): more for a
    /// short workload, whose runs differ by up to 10% on a small VM.
    reps: usize,
}

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "syscalls",
        what: "open/read/close loop on a non-tmpfs file (300k syscalls, median of 5 runs)",
        source: "syscalls.c",
        args: &["100000"],
        pin: true,
        reps: 5,
    },
    Workload {
        name: "everyday-write",
        what: "write: 64 bytes to /dev/null (200k calls)",
        source: "everyday.c",
        args: &["write", "200000"],
        pin: true,
        reps: 5,
    },
    Workload {
        name: "everyday-fcntl",
        what: "fcntl(F_GETFL) (200k calls)",
        source: "everyday.c",
        args: &["fcntl", "200000"],
        pin: true,
        reps: 5,
    },
    Workload {
        name: "everyday-append",
        what: "log appends: 100-byte writes to a file (200k calls)",
        source: "everyday.c",
        args: &["append", "200000"],
        pin: true,
        reps: 5,
    },
    Workload {
        name: "everyday-mmap",
        what: "anonymous 64 KiB mmap + munmap (200k calls)",
        source: "everyday.c",
        args: &["mmap", "100000"],
        pin: true,
        reps: 5,
    },
    Workload {
        name: "everyday-socket",
        what: "socketpair send + recv (200k calls)",
        source: "everyday.c",
        args: &["socket", "100000"],
        pin: true,
        reps: 5,
    },
    Workload {
        name: "everyday-dup",
        what: "dup + close of a /dev/null fd (200k calls)",
        source: "everyday.c",
        args: &["dup", "100000"],
        pin: true,
        reps: 5,
    },
    Workload {
        name: "loader",
        what: "shm: 4 workers create, fill, pass by fd, drop 96 segments of 1-32 MiB",
        source: "loader.c",
        args: &["24"],
        pin: false,
        // Under half a second a run: one run a round was all noise.
        reps: 5,
    },
    Workload {
        name: "epoch",
        what: "PyTorch DataLoader epoch: 2 workers, 64 batches of 4 MiB",
        source: "epoch.py",
        args: &[],
        pin: false,
        reps: 3,
    },
];

#[derive(Clone, Copy, PartialEq, Debug)]
enum Cond {
    Base,
    Floor,
    Node,
    Pid,
    Run,
    Bpftrace,
    /// Empty bpftrace programs on the syscall exits shmtrace hooks: what
    /// the kernel charges to run any program there (the rest is shmtrace's).
    Dispatch,
    Compare,
}

impl Cond {
    fn label(self) -> &'static str {
        match self {
            Cond::Base => "base",
            Cond::Floor => "floor",
            Cond::Node => "node-wide",
            Cond::Pid => "--pid (other)",
            Cond::Run => "run (traced)",
            Cond::Bpftrace => "bpftrace peer",
            Cond::Dispatch => "empty programs on the same hooks",
            Cond::Compare => "compare",
        }
    }
}

/// The peer: a bpftrace program on the same syscall exits shmtrace hooks,
/// counting failures per process, command and error.
const BPFTRACE_PEER: &str = "tracepoint:syscalls:sys_exit_write,\
tracepoint:syscalls:sys_exit_pwrite64,tracepoint:syscalls:sys_exit_writev,\
tracepoint:syscalls:sys_exit_fallocate,tracepoint:syscalls:sys_exit_ftruncate,\
tracepoint:syscalls:sys_exit_openat,tracepoint:syscalls:sys_exit_mmap,\
tracepoint:syscalls:sys_exit_recvmsg /args->ret < 0/ { @failed[pid, comm, args->ret] = count(); }";

/// Every syscall exit shmtrace hooks, with an empty program.
pub(crate) const BPFTRACE_DISPATCH: &str = "tracepoint:syscalls:sys_exit_write,\
tracepoint:syscalls:sys_exit_pwrite64,tracepoint:syscalls:sys_exit_writev,\
tracepoint:syscalls:sys_exit_pwritev,tracepoint:syscalls:sys_exit_pwritev2,\
tracepoint:syscalls:sys_exit_fallocate,tracepoint:syscalls:sys_exit_sendfile64,\
tracepoint:syscalls:sys_exit_splice,tracepoint:syscalls:sys_exit_copy_file_range,\
tracepoint:syscalls:sys_exit_open,tracepoint:syscalls:sys_exit_openat,\
tracepoint:syscalls:sys_exit_openat2,tracepoint:syscalls:sys_exit_creat,\
tracepoint:syscalls:sys_exit_mmap,tracepoint:syscalls:sys_exit_mremap,\
tracepoint:syscalls:sys_exit_ftruncate,tracepoint:syscalls:sys_exit_recvmsg,\
tracepoint:syscalls:sys_exit_unlink,tracepoint:syscalls:sys_exit_unlinkat { }";

/// The floor: one program on a syscall tracepoint nothing calls.
const BPFTRACE_FLOOR: &str = "tracepoint:syscalls:sys_exit_acct { @n = count(); }";

/// Debian's python3 with Debian's PyTorch (scripts/setup.sh --test).
const PYTHON: &str = "/usr/bin/python3";

pub struct Opts {
    pub rounds: usize,
    pub compare: Option<PathBuf>,
}

pub fn run(root: &Path, opts: Opts) -> Result<()> {
    let shmtrace = crate::release_shmtrace(root, "the benchmark")?;
    let bpftrace = ensure_bpftrace()?;
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out)?;
    let mut exes = Vec::new();
    let mut skipped = Vec::new();
    for w in WORKLOADS {
        let src = root.join("xtask/bench").join(w.source);
        if w.source.ends_with(".py") {
            let ok = Command::new(PYTHON)
                .args(["-c", "import torch"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                skipped.push(format!(
                    "{}: {PYTHON} cannot import torch (scripts/setup.sh --test installs it)",
                    w.name
                ));
                exes.push(None);
                continue;
            }
            exes.push(Some(vec![PYTHON.to_string(), src.display().to_string()]));
            continue;
        }
        exes.push(Some(vec![compile(&src, &out.join(w.name))?]));
    }

    let mut conds = vec![
        Cond::Base,
        Cond::Floor,
        Cond::Node,
        Cond::Pid,
        Cond::Run,
        Cond::Bpftrace,
        Cond::Dispatch,
    ];
    if opts.compare.is_some() {
        conds.push(Cond::Compare);
    }
    let rounds = opts.rounds.max(1);
    let blog = out.join("bpftrace.log");
    // times[workload][condition]: elapsed ns per round.
    let mut times = vec![vec![Vec::new(); conds.len()]; WORKLOADS.len()];
    let mut attach_ms: Vec<f64> = Vec::new();
    let mut pid_attach_ms: Vec<f64> = Vec::new();
    let mut rss_kib: u64 = 0;
    for round in 0..rounds {
        for k in 0..conds.len() {
            let ci = (round + k) % conds.len();
            let c = conds[ci];
            let env = match c {
                Cond::Base | Cond::Run => None,
                Cond::Floor => Some(Tracer::bpftrace(&bpftrace, BPFTRACE_FLOOR, &blog)?),
                Cond::Bpftrace => Some(Tracer::bpftrace(&bpftrace, BPFTRACE_PEER, &blog)?),
                Cond::Dispatch => Some(Tracer::bpftrace(&bpftrace, BPFTRACE_DISPATCH, &blog)?),
                Cond::Node => {
                    let t = Tracer::shmtrace(&shmtrace, &[])?;
                    attach_ms.push(t.ready_ms);
                    Some(t)
                }
                Cond::Compare => Some(Tracer::shmtrace(opts.compare.as_ref().unwrap(), &[])?),
                Cond::Pid => {
                    let t = Tracer::shmtrace_pid(&shmtrace)?;
                    pid_attach_ms.push(t.ready_ms);
                    Some(t)
                }
            };
            for (i, exe) in exes.iter().enumerate() {
                let Some(exe) = exe else { continue };
                let traced = (c == Cond::Run).then_some(shmtrace.as_path());
                let w = &WORKLOADS[i];
                let mut runs = Vec::new();
                for _ in 0..w.reps {
                    runs.push(
                        time(exe, w.args, w.pin, traced)
                            .with_context(|| format!("{} under {}", w.name, c.label()))?,
                    );
                }
                times[i][ci].push(median(&runs));
            }
            if let Some(mut env) = env {
                if c == Cond::Node {
                    rss_kib = rss_kib.max(env.peak_rss_kib());
                }
                env.stop();
            }
        }
        eprint!("\rround {}/{rounds}", round + 1);
    }
    eprintln!();

    println!(
        "shmtrace overhead: {rounds} interleaved rounds; time ratio to base per round, \
         median (min-max); 1.00 = no cost\n"
    );
    let mut header = String::from("| workload | base (x reference work) |");
    let mut rule = String::from("|---|---|");
    for c in &conds[1..] {
        let label = match c {
            Cond::Compare => format!("compare: {}", opts.compare.as_ref().unwrap().display()),
            c => c.label().to_string(),
        };
        header.push_str(&format!(" {label} |"));
        rule.push_str("---|");
    }
    header.push_str(" node-wide / floor | --pid / floor | verdict |");
    rule.push_str("---|---|---|");
    println!("{header}\n{rule}");
    for (i, w) in WORKLOADS.iter().enumerate() {
        if exes[i].is_none() {
            continue;
        }
        let base = &times[i][0];
        let ratios =
            |ci: usize| -> Vec<f64> { times[i][ci].iter().zip(base).map(|(t, b)| t / b).collect() };
        let mut row = format!("| {} | {:.1} |", w.what, median(base));
        for ci in 1..conds.len() {
            row.push_str(&format!(" {} |", spread(&ratios(ci))));
        }
        // Node-wide and --pid above the floor, round by round.
        for ci in [2, 3] {
            let above: Vec<f64> = times[i][ci]
                .iter()
                .zip(&times[i][1])
                .map(|(n, f)| n / f)
                .collect();
            row.push_str(&format!(" {} |", spread(&above)));
        }
        // Node-wide against the floor any syscall tracer pays.
        let above: Vec<f64> = times[i][2]
            .iter()
            .zip(&times[i][1])
            .map(|(n, f)| n / f)
            .collect();
        let m = median(&above);
        // Above the floor, say whose cost it is: when empty programs on the
        // same exits cost as much, no program there could do better.
        let dispatch = conds.iter().position(|c| *c == Cond::Dispatch).map(|di| {
            let e: Vec<f64> = times[i][di]
                .iter()
                .zip(&times[i][1])
                .map(|(d, f)| d / f)
                .collect();
            median(&e)
        });
        row.push_str(&match dispatch {
            _ if m <= 1.02 => " at the floor (<= x1.02 over it) |".to_string(),
            Some(e) if m <= e + 0.01 => format!(
                " x{m:.2} over the floor: what any program on these exits costs \
                 (empty programs x{e:.2}) |"
            ),
            Some(e) => format!(" x{m:.2} over the floor (empty programs x{e:.2}) |"),
            None => format!(" x{m:.2} over the floor |"),
        });
        println!("{row}");
    }
    for s in &skipped {
        println!("\nskipped {s}");
    }

    println!();
    println!(
        "attach time (start to tracing): node-wide {:.0} ms, --pid {:.0} ms (median of {rounds})",
        median(&attach_ms),
        median(&pid_attach_ms)
    );
    println!("peak RSS of node-wide shmtrace during the workloads: {rss_kib} KiB");
    let lat = latency(&shmtrace, &out, root, 7)?;
    println!(
        "failure to report (fallocate ENOSPC to its -o json line, node-wide): median {:.1} ms, \
         max {:.1} ms (7 failures)",
        median(&lat),
        lat.iter().cloned().fold(0.0, f64::max)
    );
    let (clean, lossy) = loss_onset(&shmtrace, &out, root)?;
    match lossy {
        Some((rate, lost)) => println!(
            "losses begin: none up to {clean} tmpfs events/s; at {rate} events/s {lost} of them \
             were lost (counted in lost_events), with the default 4 MiB ring"
        ),
        None => println!(
            "losses: none up to {clean} tmpfs events/s (the most this machine's churn made), \
             with the default 4 MiB ring"
        ),
    }
    Ok(())
}

fn compile(src: &Path, exe: &Path) -> Result<String> {
    let st = Command::new("gcc")
        .args(["-O2", "-Wall", "-o"])
        .arg(exe)
        .arg(src)
        .status()
        .context("gcc")?;
    if !st.success() {
        bail!("cannot compile {}", src.display());
    }
    Ok(exe.display().to_string())
}

/// bpftrace from the distribution, installed when missing.
fn ensure_bpftrace() -> Result<PathBuf> {
    let found = |p: &str| Path::new(p).exists().then(|| PathBuf::from(p));
    if let Some(p) = found("/usr/bin/bpftrace").or_else(|| found("/usr/sbin/bpftrace")) {
        return Ok(p);
    }
    eprintln!("installing bpftrace (the peer and the floor of the benchmark)...");
    let st = Command::new("apt-get")
        .args(["install", "-y", "-q", "bpftrace"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .status()
        .context("apt-get")?;
    if !st.success() {
        bail!("cannot install bpftrace (apt-get install bpftrace)");
    }
    found("/usr/bin/bpftrace").context("bpftrace is not in /usr/bin after installing it")
}

/// A tracer running in the background for one condition.
struct Tracer {
    child: Child,
    /// Another process shmtrace --pid traces (not the workload).
    idle: Option<Child>,
    ready_ms: f64,
}

impl Tracer {
    fn shmtrace(bin: &Path, extra: &[&str]) -> Result<Self> {
        let start = Instant::now();
        let mut child = Command::new(bin)
            .arg("--quiet")
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("{}", bin.display()))?;
        wait_line(&mut child, false, "tracing every process")?;
        Ok(Self {
            child,
            idle: None,
            ready_ms: start.elapsed().as_secs_f64() * 1e3,
        })
    }

    fn shmtrace_pid(bin: &Path) -> Result<Self> {
        let idle = Command::new("sleep").arg("100000").spawn()?;
        let start = Instant::now();
        let mut child = Command::new(bin)
            .args(["--quiet", "--pid", &idle.id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        wait_line(&mut child, false, "tracing pid")?;
        Ok(Self {
            child,
            idle: Some(idle),
            ready_ms: start.elapsed().as_secs_f64() * 1e3,
        })
    }

    fn bpftrace(bin: &Path, program: &str, log: &Path) -> Result<Self> {
        let start = Instant::now();
        // Its stderr has a harmless complaint about RLIMIT_MEMLOCK here.
        let log = std::fs::File::create(log).ok();
        let mut child = Command::new(bin)
            .args(["-e", program])
            .stdout(Stdio::piped())
            .stderr(log.map_or(Stdio::inherit(), Stdio::from))
            .spawn()
            .context("bpftrace")?;
        wait_line(&mut child, true, "Attaching")?;
        Ok(Self {
            child,
            idle: None,
            ready_ms: start.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// VmHWM of the tracer, in KiB.
    fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    fn stop(&mut self) {
        // SAFETY: kill(2) of our own child with SIGINT.
        unsafe { libc_kill(self.child.id() as i32, 2) };
        let _ = self.child.wait();
        if let Some(idle) = &mut self.idle {
            let _ = idle.kill();
            let _ = idle.wait();
        }
    }
}

/// Waits for a line containing `marker` on the child's stdout or stderr,
/// then keeps draining that pipe so the child never blocks on it.
pub(crate) fn wait_line(child: &mut Child, stdout: bool, marker: &str) -> Result<()> {
    let pipe: Box<dyn std::io::Read + Send> = if stdout {
        Box::new(child.stdout.take().context("stdout")?)
    } else {
        Box::new(child.stderr.take().context("stderr")?)
    };
    let mut lines = BufReader::new(pipe).lines();
    for line in lines.by_ref() {
        let line = line?;
        if line.contains(marker) {
            std::thread::spawn(move || for _ in lines {});
            // Probes are attached when the line is printed; let the
            // tracer's first tick pass before timing anything.
            std::thread::sleep(Duration::from_millis(300));
            return Ok(());
        }
    }
    let _ = child.wait();
    bail!("the tracer exited before it printed '{marker}'")
}

/// Runs one workload in a private 512 MiB /dev/shm and returns its own
/// elapsed time (what it prints as "ns") in units of its reference work.
fn time(cmdline: &[String], args: &[&str], pin: bool, shmtrace: Option<&Path>) -> Result<f64> {
    let mut cmdline = cmdline.to_vec();
    if pin {
        let last = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
        cmdline.splice(0..0, ["taskset".to_string(), "-c".into(), last.to_string()]);
    }
    let cmdline = &cmdline[..];
    let text = in_private_shm(cmdline, args, "512m", shmtrace)?;
    let ns =
        json_number(&text, "ns").with_context(|| format!("no timing from {cmdline:?}: {text}"))?;
    // Divided by the same process's timed CPU work (xtask/bench/ref.h):
    // on a small shared VM the whole machine speeds up and slows down with
    // its host's load, which this cancels out of the ratios.
    let reference = json_number(&text, "ref_ns").with_context(|| format!("no ref_ns: {text}"))?;
    Ok(ns / reference)
}

fn in_private_shm(
    cmdline: &[String],
    args: &[&str],
    size: &str,
    shmtrace: Option<&Path>,
) -> Result<String> {
    let script = format!(
        "mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {} {}",
        cmdline.join(" "),
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
        bail!("{cmdline:?} failed: {}", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Milliseconds from a failing fallocate (its own clock reading) to the
/// moment node-wide shmtrace's `-o json` line about it arrives here.
fn latency(shmtrace: &Path, out: &Path, root: &Path, n: usize) -> Result<Vec<f64>> {
    let fail = compile(&root.join("xtask/bench/fail.c"), &out.join("fail"))?;
    let mut child = Command::new(shmtrace)
        .args(["-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    wait_line(&mut child, false, "tracing every process")?;
    let (tx, rx) = mpsc::channel::<(u64, String)>();
    let stdout = child.stdout.take().context("stdout")?;
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send((monotonic_ns(), line)).is_err() {
                break;
            }
        }
    });
    let mut lat = Vec::new();
    for _ in 0..n {
        let text = in_private_shm(std::slice::from_ref(&fail), &[], "1m", None)?;
        let pid = json_number(&text, "pid").context("fail printed no pid")? as u64;
        let failed = json_number(&text, "failed_ns").context("fail printed no time")? as u64;
        let want = format!("\"pid\":{pid},");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (at, line) = rx
                .recv_timeout(left)
                .with_context(|| format!("no failure line for pid {pid} within 10 s"))?;
            if line.contains("\"type\":\"failure\"") && line.contains(&want) {
                lat.push(at.saturating_sub(failed) as f64 / 1e6);
                break;
            }
        }
    }
    // SAFETY: kill(2) of our own child with SIGINT.
    unsafe { libc_kill(child.id() as i32, 2) };
    let _ = child.wait();
    Ok(lat)
}

/// Raises the tmpfs event rate until node-wide shmtrace's ring loses
/// events: (highest rate without a loss, first rate with one and the loss).
fn loss_onset(shmtrace: &Path, out: &Path, root: &Path) -> Result<(u64, Option<(u64, u64)>)> {
    let churn = compile(&root.join("xtask/bench/churn.c"), &out.join("churn"))?;
    let report = out.join("loss-report.json");
    let mut clean = 0;
    // Files per second asked of the workload (0: as fast as it goes);
    // each is one event (an open with O_CREAT; close is not hooked).
    for asked in [10_000u64, 25_000, 50_000, 100_000, 0] {
        let _ = std::fs::remove_file(&report);
        let report_s = report.display().to_string();
        let mut t = Tracer::shmtrace(shmtrace, &["--report", &report_s])?;
        let text = in_private_shm(
            std::slice::from_ref(&churn),
            &[&asked.to_string(), "2"],
            "64m",
            None,
        );
        t.stop();
        let text = text?;
        let files = json_number(&text, "files").context("churn printed no count")?;
        let ns = json_number(&text, "ns").context("churn printed no time")?;
        let rate = (files / (ns / 1e9)) as u64;
        let r = std::fs::read_to_string(&report)
            .with_context(|| format!("no report at {}", report.display()))?;
        let lost = json_number(&r, "lost_events").unwrap_or(0.0) as u64;
        if lost > 0 {
            return Ok((clean, Some((rate, lost))));
        }
        clean = clean.max(rate);
    }
    Ok((clean, None))
}

/// The number after `"key":` in a JSON text (first occurrence).
fn json_number(text: &str, key: &str) -> Option<f64> {
    text.split(&format!("\"{key}\":"))
        .nth(1)
        .and_then(|s| s.split([',', '}']).next())
        .and_then(|s| s.trim().parse::<f64>().ok())
}

pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

/// "x1.012 (1.004-1.020)": median and range of ratios.
pub(crate) fn spread(v: &[f64]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    format!("x{:.3} ({lo:.3}-{hi:.3})", median(v))
}

/// CLOCK_MONOTONIC in ns (the clock the workloads print).
fn monotonic_ns() -> u64 {
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into `ts`, which lives
    // across the call.
    unsafe { clock_gettime(1, &mut ts) };
    ts.sec as u64 * 1_000_000_000 + ts.nsec as u64
}

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}
