//! The diagnosis: signature, what PyTorch got wrong, a computed /dev/shm
//! size that really fixes the job (and a smaller one that does not), the
//! --verify control rerun, and `doctor`.

use std::process::{Command, Stdio};

use serde_json::Value;
use shmtrace_tests::*;

const VENV: &str = "/var/cache/shmtrace/torch-venv/bin/python";

/// `shmtrace run --shm-size SIZE [--verify] --report R -- CMD`.
fn run_sized(size: &str, verify: bool, cmd: &[String]) -> (std::process::Output, Value) {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("diag");
    let report = dir.join("r.json");
    let mut c = Command::new(shmtrace());
    c.args(["run", "--shm-size", size, "--report"]).arg(&report);
    if verify {
        c.arg("--verify");
    }
    let out = c.arg("--").args(cmd).stdin(Stdio::null()).output().unwrap();
    let text = std::fs::read_to_string(&report)
        .unwrap_or_else(|_| panic!("no report: {}", String::from_utf8_lossy(&out.stderr)));
    let _ = std::fs::remove_dir_all(dir);
    (out, report_json(&text))
}

fn steady(python: &str, args: &str) -> Vec<String> {
    let script = root_dir().join("tests/python/dataloader_steady.py");
    let mut v = vec![python.to_string(), script.display().to_string()];
    v.extend(args.split_whitespace().map(String::from));
    v
}

/// Fails at 64 MiB, diagnosed; the computed size fixes it (verified by the
/// rerun); half of it still fails.
fn size_and_verify(python: &str, args: &str, signature: &str) {
    let cmd = steady(python, args);
    let (out, r) = run_sized("64M", true, &cmd);
    let err = String::from_utf8_lossy(&out.stderr);
    let d = &r["diagnosis"];
    assert_eq!(d["signature"], signature, "{err}");
    assert!(!r["failures"].as_array().unwrap().is_empty());
    let rec = d["recommended_shm_bytes"]
        .as_u64()
        .expect("a recommended size");
    assert!(rec > 64 << 20);
    assert!(
        d["docker"]
            .as_str()
            .unwrap()
            .contains(&format!("--shm-size={}m", rec >> 20))
    );
    assert!(
        d["kubernetes"]
            .as_str()
            .unwrap()
            .contains(&format!("sizeLimit: {}Mi", rec >> 20))
    );
    assert!(d["dataloader"].as_str().unwrap().contains("num_workers"));
    assert!(
        d["caveat"].is_null(),
        "a DataLoader main holding its prefetched batches is no hoard: {d}"
    );
    // --verify: the rerun at that size did not fail on shared memory.
    assert_eq!(r["verify"]["shm_size_bytes"].as_u64(), Some(rec));
    assert_eq!(r["verify"]["failure_gone"], true, "{err}");
    assert!(
        r["verify"]["rerun"]["failures"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "--verify exits 0 when the fix works: {err}"
    );
    assert!(err.contains("the fix works"), "{err}");
    // Well below the computed size, the same command still fails.
    let (out, r) = run_sized(&format!("{}M", (rec / 2) >> 20), false, &cmd);
    assert!(
        !r["failures"].as_array().unwrap().is_empty(),
        "at half the size it should fail"
    );
    assert_ne!(out.status.code(), Some(0));
}

#[test]
fn debian_torch_sigbus_size_fix_and_verify() {
    // 3x256x256 float32 samples, batches of 32 (24 MiB), 2 workers.
    size_and_verify(
        "/usr/bin/python3",
        "196608 32 2 12",
        "pytorch-dataloader:sigbus",
    );
}

#[test]
fn pypi_torch_enospc_size_fix_and_verify() {
    // 16 MiB samples, batches of 2 (32 MiB), 2 workers.
    size_and_verify(
        VENV,
        "4194304 2 2 10",
        "pytorch-dataloader:enospc-fallocate",
    );
}

#[test]
fn diagnosis_says_when_pytorch_names_the_wrong_worker() {
    let dir = scratch("misname");
    let truth = dir.join("truth");
    let lib = shared_lib("sigbus_truth");
    let script = root_dir().join("tests/python/dataloader_sigbus.py");
    let cmd = vec![
        "/usr/bin/python3".to_string(),
        script.display().to_string(),
        truth.display().to_string(),
        lib.display().to_string(),
        "busy".into(),
    ];
    let (out, r) = run_sized("64M", false, &cmd);
    let err = String::from_utf8_lossy(&out.stderr);
    // What PyTorch itself printed.
    let named: u64 = err
        .split("DataLoader worker (pid ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("PyTorch's message:\n{err}"));
    // Who really failed first, from the workers' own handlers.
    let mut records: Vec<(u64, u64)> = std::fs::read_to_string(&truth)
        .unwrap()
        .lines()
        .map(|l| {
            let mut it = l.split(' ');
            (
                it.next().unwrap().parse().unwrap(),
                it.next().unwrap().parse().unwrap(),
            )
        })
        .collect();
    records.sort_by_key(|r| r.1);
    let first = records[0].0;
    assert_ne!(
        named, first,
        "the workload is built so PyTorch names another worker: {records:?}\n{err}"
    );
    assert_eq!(r["first_failure"]["pid"].as_u64(), Some(first));
    let d = &r["diagnosis"];
    assert!(
        d["framework_message"]
            .as_str()
            .unwrap()
            .contains(&format!("(pid {named})")),
        "{d}"
    );
    let wrong = d["framework_misleads"]
        .as_str()
        .expect("the diagnosis says PyTorch misleads");
    assert!(
        wrong.contains(&format!("names pid {named}")) && wrong.contains(&format!("pid {first}")),
        "{wrong}"
    );
    assert!(err.contains("but            PyTorch names"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn doctor_reports_this_machine() {
    require_root();
    let _lock = bpf_lock(false);
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {} doctor",
            shmtrace().display()
        ))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // This kernel: tracepoints load, kprobes and fentry do not.
    for hook in [
        "tracepoint syscalls:sys_exit_openat",
        "tracepoint syscalls:sys_exit_fallocate",
        "raw_tp/signal_generate",
        "tracepoint sched:sched_process_exit",
        "tracepoint oom:mark_victim",
    ] {
        assert!(
            text.lines().any(|l| l.contains(hook) && l.ends_with("ok")),
            "{hook}:\n{text}"
        );
    }
    assert!(text.contains("kprobes: unavailable"), "{text}");
    assert!(text.contains("fentry/fexit: unavailable"), "{text}");
    assert!(
        text.contains("BTF          /sys/kernel/btf/vmlinux"),
        "{text}"
    );
    assert!(text.contains("/dev/shm     tmpfs 64.0 MiB"), "{text}");
    assert!(text.contains("64.0 MiB is Docker's default"), "{text}");
    // One column for the hooks' verdicts, however long a name.
    let cols: std::collections::BTreeSet<usize> = text
        .lines()
        .filter(|l| l.starts_with("  ") && l.ends_with(" ok"))
        .map(|l| l.len() - 2)
        .collect();
    assert_eq!(cols.len(), 1, "hook verdicts drift:\n{text}");
}
