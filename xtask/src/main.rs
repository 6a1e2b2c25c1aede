//! Project chores that need more than one cargo command.
//!
//!   cargo xtask lint    rustfmt check, clippy on user space, clippy on the
//!                       eBPF programs for their own target
//!   cargo xtask bench   overhead as ratios to no tracer and to the kernel's
//!                       floor, bpftrace beside; attach time, latency,
//!                       loss onset, RSS; the agent's own CPU idle, per
//!                       process start and on a steady node (as root;
//!                       --agent: that last table only)
//!   cargo xtask bench --vm KERNEL
//!                       the same ratios on one of Debian's kernels
//!                       (5.10, 6.1, 6.12) under QEMU: nothing attached,
//!                       the floor, empty programs, --hooks tracepoints,
//!                       --hooks trampolines
//!   cargo xtask soak    node-wide shmtrace under churn: memory and CPU
//!                       over time (as root)

mod agent;
mod bench;
#[path = "../../tests/src/guest.rs"]
mod guest;
mod soak;
mod vm_bench;

use std::process::Command;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// rustfmt --check and clippy (-D warnings) everywhere, eBPF included.
    Lint,
    /// Measure what shmtrace costs the processes it watches (and the rest).
    Bench {
        /// Interleaved rounds per condition.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Another shmtrace binary to measure node-wide beside this one
        /// (an older build, an alternative design).
        #[arg(long, value_name = "BIN")]
        compare: Option<std::path::PathBuf>,
        /// Only the agent's own CPU: idle, per process start, on a steady
        /// node (a minute, not the whole table).
        #[arg(long)]
        agent: bool,
        /// Run inside Debian's kernel SERIES (5.10, 6.1, 6.12) under QEMU,
        /// where BPF trampolines work: nothing attached, the floor, empty
        /// programs on the syscall exits, --hooks tracepoints and --hooks
        /// trampolines, on the everyday syscalls and the shm workload
        /// (scripts/setup.sh --test fetches the kernels; TCG: ratios only,
        /// about 3 minutes a round).
        #[arg(long, value_name = "KERNEL", conflicts_with_all = ["compare", "agent"])]
        vm: Option<String>,
    },
    /// Node-wide shmtrace under process, file, namespace and SIGBUS churn:
    /// RSS and CPU over time, and the budget they set.
    Soak {
        /// How long to churn.
        #[arg(long, default_value_t = 5.0)]
        minutes: f64,
        /// Seconds between samples.
        #[arg(long, default_value_t = 10)]
        every: u64,
    },
}

fn cargo(args: &[&str], dir: Option<&str>, bootstrap: bool) -> Result<()> {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.args(args);
    if let Some(d) = dir {
        c.current_dir(d);
    }
    if bootstrap {
        // The eBPF target builds core from source (-Z build-std) on stable.
        c.env("RUSTC_BOOTSTRAP", "1");
    }
    let st = c.status()?;
    if !st.success() {
        bail!("cargo {} failed", args.join(" "));
    }
    Ok(())
}

/// Refuses to go on unless root (`what` needs to load eBPF programs), then
/// builds the release shmtrace and returns its path.
fn release_shmtrace(root: &std::path::Path, what: &str) -> Result<std::path::PathBuf> {
    let uid = std::fs::read_to_string("/proc/self/status")?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1).map(str::to_string));
    if uid.as_deref() != Some("0") {
        bail!("{what} loads eBPF programs: run it as root");
    }
    cargo(
        &["build", "--release", "--quiet", "-p", "shmtrace"],
        root.to_str(),
        false,
    )?;
    Ok(root.join("target/release/shmtrace"))
}

fn main() -> Result<()> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    match Cli::parse().cmd {
        Cmd::Bench {
            rounds,
            compare,
            agent,
            vm,
        } => {
            let root = std::path::Path::new(root);
            if let Some(series) = vm {
                return vm_bench::run(root, &series, rounds);
            }
            if !agent {
                bench::run(
                    root,
                    bench::Opts {
                        rounds,
                        compare: compare.clone(),
                    },
                )?;
            }
            let bin = release_shmtrace(root, "the benchmark")?;
            agent::run(&bin, compare.as_deref())?
        }
        Cmd::Soak { minutes, every } => soak::run(std::path::Path::new(root), minutes, every)?,
        Cmd::Lint => {
            cargo(&["fmt", "--all", "--check"], Some(root), false)?;
            cargo(
                &[
                    "clippy",
                    "--release",
                    "--workspace",
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ],
                Some(root),
                false,
            )?;
            let ebpf = format!("{root}/shmtrace-ebpf");
            cargo(
                &[
                    "clippy",
                    "--release",
                    "--target",
                    "bpfel-unknown-none",
                    "-Z",
                    "build-std=core",
                    "--bins",
                    "--",
                    "-D",
                    "warnings",
                ],
                Some(&ebpf),
                true,
            )?;
        }
    }
    Ok(())
}
