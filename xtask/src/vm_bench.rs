//! `cargo xtask bench --vm KERNEL`: what each backend costs work that never
//! touches tmpfs, and the shm workload, on one of Debian's kernels (5.10,
//! 6.1, 6.12) under QEMU, where BPF trampolines work (this machine's
//! kernel refuses them). TCG emulates every instruction, so only ratios
//! mean anything: each run is divided by the CPU work it times around
//! itself (ref.h), each condition by nothing attached in the same round,
//! and rounds rotate the conditions (xtask/bench/vm-init.sh).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::{
    bench::{BPFTRACE_DISPATCH, median, spread},
    guest,
};

struct VmWorkload {
    name: &'static str,
    what: &'static str,
    source: &'static str,
    args: &'static str,
    reps: usize,
    /// Touches /dev/shm (the rest never does).
    shm: bool,
}

/// The host benchmark's workloads, some shorter: TCG runs each syscall
/// a few times slower, and the shm workload's memory far slower.
const WORKLOADS: &[VmWorkload] = &[
    VmWorkload {
        name: "syscalls",
        what: "open/read/close of a non-tmpfs file (300k calls)",
        source: "syscalls.c",
        args: "100000",
        reps: 5,
        shm: false,
    },
    VmWorkload {
        name: "write",
        what: "write: 64 bytes to /dev/null (200k)",
        source: "everyday.c",
        args: "write 200000",
        reps: 5,
        shm: false,
    },
    VmWorkload {
        name: "fcntl",
        what: "fcntl(F_GETFL) (200k)",
        source: "everyday.c",
        args: "fcntl 200000",
        reps: 5,
        shm: false,
    },
    VmWorkload {
        name: "append",
        what: "log appends: 100-byte writes to a file (100k)",
        source: "everyday.c",
        args: "append 100000",
        reps: 5,
        shm: false,
    },
    VmWorkload {
        name: "mmap",
        what: "anonymous 64 KiB mmap + munmap (30k)",
        source: "everyday.c",
        args: "mmap 30000",
        reps: 5,
        shm: false,
    },
    VmWorkload {
        name: "socket",
        what: "socketpair send + recv (50k)",
        source: "everyday.c",
        args: "socket 50000",
        reps: 5,
        shm: false,
    },
    VmWorkload {
        name: "dup",
        what: "dup + close of a /dev/null fd (100k)",
        source: "everyday.c",
        args: "dup 100000",
        reps: 5,
        shm: false,
    },
    VmWorkload {
        name: "loader",
        what: "shm: 4 workers create, fill, pass by fd, drop 24 segments of 1-32 MiB",
        source: "loader.c",
        args: "6",
        reps: 5,
        shm: true,
    },
];

/// The conditions, in vm-init.sh's order, with their column heads.
const CONDS: &[(&str, &str)] = &[
    ("base", "base (x reference work)"),
    ("floor", "floor (one empty program, sys_exit_acct)"),
    ("empty", "empty programs on the syscall exits"),
    ("tracepoints", "--hooks tracepoints"),
    ("trampolines", "--hooks trampolines"),
];

pub fn run(root: &Path, series: &str, rounds: usize) -> Result<()> {
    let shmtrace = crate::release_shmtrace(root, "the benchmark")?;
    let kernel = guest::kernel(series)?;
    let dir = root.join(format!("target/bench/vm-{series}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let tree = guest::Initramfs::new(&dir)?;
    tree.put_dynamic(&shmtrace, "/bin/shmtrace")?;
    let bench = root.join("xtask/bench");
    let mut built: BTreeSet<&str> = BTreeSet::new();
    for src in WORKLOADS.iter().map(|w| w.source).chain(["empty.c"]) {
        if !built.insert(src) {
            continue;
        }
        let name = src.trim_end_matches(".c");
        let exe = guest::static_build(&bench.join(src), &dir.join(name))?;
        tree.put(&exe, &format!("/work/{name}"))?;
    }
    let list: String = WORKLOADS
        .iter()
        .map(|w| {
            format!(
                "{} {} {} {}\n",
                w.name,
                w.reps,
                w.source.trim_end_matches(".c"),
                w.args
            )
        })
        .collect();
    std::fs::write(dir.join("workloads"), list)?;
    tree.put(&dir.join("workloads"), "/work/workloads")?;
    std::fs::write(dir.join("exits"), exits().join(" "))?;
    tree.put(&dir.join("exits"), "/work/exits")?;
    tree.put(&bench.join("vm-init.sh"), "/init")?;
    let initrd = tree.pack(&dir.join("initrd.gz"))?;

    eprintln!(
        "booting {} under QEMU (TCG) for {rounds} rounds of {} conditions; \
         about {} minutes...",
        kernel.display(),
        CONDS.len(),
        1 + rounds * 5
    );
    let limit = Duration::from_secs(600 + 600 * rounds as u64);
    let booted = guest::boot(
        &kernel,
        &initrd,
        &format!("shmtrace.rounds={rounds}"),
        &dir,
        limit,
    )?;
    std::fs::write(dir.join("data.log"), &booted.data)?;
    let s = guest::sections(&booted.data);
    let kernel_line = s
        .keys()
        .find(|(n, _)| n == "kernel")
        .map(|(_, f)| f.clone())
        .with_context(|| format!("the guest never ran /init:\n{}", booted.console))?;
    let runs = s
        .get(&("runs".to_string(), "x".to_string()))
        .map_or("", String::as_str);
    let errors: Vec<&str> = runs.lines().filter(|l| l.starts_with("error ")).collect();
    if !errors.is_empty() {
        bail!("runs failed in the guest:\n{}", errors.join("\n"));
    }
    if !s.contains_key(&("done".to_string(), String::new())) {
        bail!(
            "the guest did not finish its rounds:\n{}\nconsole:\n{}",
            booted.data,
            booted.console
        );
    }
    let times = parse_runs(runs)?;
    let doctor = &s[&("doctor".to_string(), "trampolines".to_string())];
    print_table(&kernel_line, rounds, &times, doctor);
    eprintln!(
        "(the guest ran {:.0?}; its output: {})",
        booted.elapsed,
        dir.join("data.log").display()
    );
    Ok(())
}

/// The syscall exits shmtrace's tracepoint backend attaches to, as the
/// host benchmark's empty bpftrace programs name them.
fn exits() -> Vec<&'static str> {
    BPFTRACE_DISPATCH
        .trim_end_matches(" { }")
        .split(',')
        .map(|t| t.trim().trim_start_matches("tracepoint:syscalls:"))
        .collect()
}

/// (workload, condition) -> per round, its runs' times in units of their
/// reference work (the table takes the fastest of a round: the run the
/// emulator's host disturbed least; TCG runs differ by ±8%).
type Times = BTreeMap<(String, String), BTreeMap<usize, Vec<f64>>>;

fn parse_runs(runs: &str) -> Result<Times> {
    let mut t: Times = BTreeMap::new();
    for line in runs.lines().filter(|l| l.starts_with("run ")) {
        let mut w = line.splitn(5, ' ');
        let (_, round, cond, name, json) = (w.next(), w.next(), w.next(), w.next(), w.next());
        let (Some(round), Some(cond), Some(name), Some(json)) = (round, cond, name, json) else {
            bail!("a run line cut short: {line}");
        };
        let num = |k: &str| {
            json.split(&format!("\"{k}\":"))
                .nth(1)
                .and_then(|s| s.split([',', '}']).next())
                .and_then(|s| s.trim().parse::<f64>().ok())
                .with_context(|| format!("no {k} in {line}"))
        };
        t.entry((name.to_string(), cond.to_string()))
            .or_default()
            .entry(round.parse()?)
            .or_default()
            .push(num("ns")? / num("ref_ns")?);
    }
    Ok(t)
}

fn print_table(kernel: &str, rounds: usize, times: &Times, doctor: &str) {
    let on = doctor
        .lines()
        .filter(|l| l.contains(" trampolines (fexit/"))
        .count();
    println!(
        "shmtrace overhead in QEMU (TCG), Debian's kernel {kernel}: {rounds} interleaved rounds; \
         time ratio to base per round (fastest of 5 runs each), median (min-max); \
         1.00 = no cost. \
         With --hooks trampolines, {on} needs were on trampolines.\n"
    );
    let mut header = String::from("| workload |");
    let mut rule = String::from("|---|");
    for (_, label) in CONDS {
        header.push_str(&format!(" {label} |"));
        rule.push_str("---|");
    }
    println!("{header} verdict |\n{rule}---|");
    for w in WORKLOADS {
        let per_round = |cond: &str| -> BTreeMap<usize, f64> {
            times
                .get(&(w.name.to_string(), cond.to_string()))
                .map(|r| {
                    r.iter()
                        .map(|(k, v)| (*k, v.iter().copied().fold(f64::INFINITY, f64::min)))
                        .collect()
                })
                .unwrap_or_default()
        };
        let base = per_round("base");
        let ratios = |cond: &str| -> Vec<f64> {
            per_round(cond)
                .iter()
                .filter_map(|(r, t)| base.get(r).map(|b| t / b))
                .collect()
        };
        let mut row = format!(
            "| {} | {:.2} |",
            w.what,
            median(&base.values().copied().collect::<Vec<_>>())
        );
        for (cond, _) in &CONDS[1..] {
            row.push_str(&format!(" {} |", spread(&ratios(cond))));
        }
        let m = median(&ratios("trampolines"));
        let (bound, who) = if w.shm {
            (1.03, "the shm workload")
        } else {
            (1.02, "work that never touches tmpfs")
        };
        row.push_str(&if m <= bound {
            format!(" trampolines within x{bound:.2} of nothing attached ({who}) |")
        } else {
            format!(" trampolines x{m:.3}: above x{bound:.2} ({who}) |")
        });
        println!("{row}");
    }
}
