//! What node-wide shmtrace itself costs the node: its CPU (every thread,
//! from /proc/PID/task/*/schedstat, nanoseconds) while idle, per process
//! start, and on a steady node. Each load's CPU is net of the idle rate
//! measured just before it, and compared with `--compare BIN` when given
//! (an older build), measured the same way in turn.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

/// Process starts per measurement.
const STARTS: usize = 3000;
/// The steady node: this many process starts a second, a 1 MiB /dev/shm
/// file rewritten each second, a metrics scrape every 5 s.
const STEADY_STARTS_PER_S: u32 = 20;
const STEADY_S: u64 = 20;
const PORT: u16 = 19466;

/// CPU time of every thread of `pid`, in ns.
fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

struct Agent {
    child: Child,
}

impl Agent {
    fn start(bin: &Path) -> Result<Self> {
        let mut child = Command::new(bin)
            .args(["--quiet", "--metrics", &format!("127.0.0.1:{PORT}")])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| bin.display().to_string())?;
        super::bench::wait_line(&mut child, false, "tracing every process")?;
        // Let its first ticks (mount tables, /dev/shm sizes) pass.
        std::thread::sleep(Duration::from_secs(2));
        Ok(Self { child })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its CPU in ns/s over `d` with nothing else running.
    fn idle_rate(&self, d: Duration) -> f64 {
        let (c0, t0) = (cpu_ns(self.pid()), Instant::now());
        std::thread::sleep(d);
        (cpu_ns(self.pid()) - c0) as f64 / t0.elapsed().as_secs_f64()
    }

    /// Its CPU in ns during `work`, less the idle rate over that time.
    fn net_cpu(&self, idle: f64, work: impl FnOnce() -> Result<()>) -> Result<(f64, f64)> {
        let (c0, t0) = (cpu_ns(self.pid()), Instant::now());
        work()?;
        // Its last batch: the ring is drained every 100-200 ms.
        std::thread::sleep(Duration::from_millis(500));
        let secs = t0.elapsed().as_secs_f64();
        let used = (cpu_ns(self.pid()) - c0) as f64;
        Ok(((used - idle * secs).max(0.0), secs))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: kill(2) of our own child with SIGINT.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
    }
}

fn starts(n: usize) -> Result<()> {
    for _ in 0..n {
        Command::new("/bin/true").status().context("/bin/true")?;
    }
    Ok(())
}

/// The steady node: process starts, a /dev/shm writer, scrapes.
fn steady(dir: &Path) -> Result<()> {
    let file = dir.join("steady-shm");
    let data = vec![1u8; 1 << 20];
    let per = Duration::from_secs(1) / STEADY_STARTS_PER_S;
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < Duration::from_secs(STEADY_S) {
        Command::new("/bin/true").status()?;
        n += 1;
        if n.is_multiple_of(STEADY_STARTS_PER_S as u64) {
            std::fs::write(&file, &data)?;
        }
        if n.is_multiple_of(STEADY_STARTS_PER_S as u64 * 5) {
            let _ = Command::new("curl")
                .args([
                    "-s",
                    "-o",
                    "/dev/null",
                    &format!("http://127.0.0.1:{PORT}/metrics"),
                ])
                .status();
        }
        let next = per * n as u32;
        if let Some(wait) = next.checked_sub(t0.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    let _ = std::fs::remove_file(&file);
    Ok(())
}

/// One binary's figures: (idle % of a core, us per process start,
/// steady node % of a core).
fn measure(bin: &Path, shm: &Path) -> Result<(f64, f64, f64)> {
    let agent = Agent::start(bin)?;
    let idle = agent.idle_rate(Duration::from_secs(5));
    let (per_starts, _) = agent.net_cpu(idle, || starts(STARTS))?;
    let idle2 = agent.idle_rate(Duration::from_secs(3));
    let (steady_ns, secs) = agent.net_cpu(idle2, || steady(shm))?;
    Ok((
        idle / 1e7,
        per_starts / STARTS as f64 / 1e3,
        (steady_ns + idle2 * secs) / secs / 1e7,
    ))
}

/// Prints the agent's own cost, for `bin` and (when given) `compare`.
pub fn run(bin: &Path, compare: Option<&Path>) -> Result<()> {
    // The /dev/shm writer writes the host's /dev/shm: a tmpfs, as on a node.
    let shm = Path::new("/dev/shm");
    println!("\nthe agent's own CPU, node-wide (every thread; net of its idle rate):\n");
    println!(
        "| build | idle, % of a core | per process start | steady node, % of a core | verdict |"
    );
    println!("|---|---|---|---|---|");
    let mut rows = vec![("this build".to_string(), bin.to_path_buf())];
    if let Some(c) = compare {
        rows.push((format!("compare: {}", c.display()), c.to_path_buf()));
    }
    for (label, b) in rows {
        let (idle, per_start, steady) = measure(&b, shm)?;
        let verdict = if per_start <= 20.0 && steady <= 0.3 {
            "ok: <= 20 us a start, <= 0.3% steady"
        } else {
            "over target (20 us a start, 0.3% steady)"
        };
        println!("| {label} | {idle:.2}% | {per_start:.1} us | {steady:.2}% | {verdict} |");
    }
    println!(
        "\n(per process start: {STARTS} fork+exec+exit of /bin/true; steady node: {STEADY_STARTS_PER_S} starts/s, a 1 MiB /dev/shm file rewritten each second, /metrics scraped every 5 s, for {STEADY_S} s)"
    );
    Ok(())
}
