//! Real PyTorch DataLoaders failing in a private 64 MiB /dev/shm: Debian's
//! 1.13 (SIGBUS on a page fault) and PyPI's 2.x (ENOSPC from fallocate).
//! The truth comes from inside the workers, not from shmtrace.

use shmtrace_tests::*;

fn venv_python() -> String {
    let venv = std::env::var("SHMTRACE_TORCH_VENV")
        .unwrap_or_else(|_| "/var/cache/shmtrace/torch-venv".into());
    let py = format!("{venv}/bin/python");
    assert!(
        std::path::Path::new(&py).exists(),
        "{py} missing: scripts/test.sh installs PyPI torch"
    );
    py
}

/// (pid, ts_ns) lines of a truth file, earliest first.
fn truth_lines(path: &std::path::Path) -> Vec<(u64, u64, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut v: Vec<(u64, u64, String)> = text
        .lines()
        .map(|l| {
            let mut it = l.splitn(3, ' ');
            (
                it.next().unwrap().parse().unwrap(),
                it.next().unwrap().parse().unwrap(),
                it.next().unwrap_or("").to_string(),
            )
        })
        .collect();
    v.sort_by_key(|t| t.1);
    v
}

fn main_pid(stdout: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("main "))
        .and_then(|p| p.trim().parse().ok())
        .expect("main pid")
}

#[test]
fn debian_torch_dataloader_sigbus() {
    let dir = scratch("torch-deb");
    let truth = dir.join("truth");
    let lib = shared_lib("sigbus_truth");
    let script = root_dir().join("tests/python/dataloader_sigbus.py");
    let cmd = private_shm(
        "size=64m",
        &format!(
            "exec /usr/bin/python3 {} {} {}",
            script.display(),
            truth.display(),
            lib.display()
        ),
    );
    let t = run_traced(&[], &cmd);
    let out = format!("{}{}", t.stdout(), t.stderr());
    assert!(
        out.contains("killed by signal: Bus error"),
        "PyTorch's own message:\n{out}"
    );
    let records = truth_lines(&truth);
    assert!(!records.is_empty(), "no worker recorded a SIGBUS:\n{out}");
    let workers = std::fs::read_to_string(truth.with_extension("workers")).unwrap();
    let worker1: u64 = workers
        .lines()
        .find_map(|l| l.strip_prefix("1 "))
        .unwrap()
        .parse()
        .unwrap();
    // By construction worker 1 meets the full tmpfs first; its handler says so.
    assert_eq!(records[0].0, worker1, "truth: {records:?}");

    let f = t.first();
    assert_eq!(
        f["pid"].as_u64(),
        Some(records[0].0),
        "shmtrace's first failure vs the workers' own record:\n{}",
        t.stderr()
    );
    assert_eq!(f["kind"], "sigbus");
    assert_eq!(f["si_code_name"], "BUS_ADRERR");
    assert!(
        f["path"].as_str().unwrap().starts_with("/dev/shm/torch_"),
        "{f}"
    );
    assert_eq!(
        f["ppid"].as_u64(),
        Some(main_pid(&t.stdout())),
        "a worker of the traced main process"
    );
    // The fault address the worker saw is the one the kernel reported.
    let addr = u64::from_str_radix(
        f["fault_addr"].as_str().unwrap().trim_start_matches("0x"),
        16,
    )
    .unwrap();
    let seen: Vec<u64> = records
        .iter()
        .filter(|r| r.0 == records[0].0)
        .map(|r| u64::from_str_radix(&r.2, 16).unwrap())
        .collect();
    assert!(
        seen.contains(&addr),
        "kernel {addr:#x} vs handler {seen:x?}"
    );
    assert_eq!(f["mount"]["size_bytes"].as_u64(), Some(64 << 20));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn pypi_torch_dataloader_fallocate_enospc() {
    let dir = scratch("torch-pypi");
    let truth = dir.join("truth");
    let script = root_dir().join("tests/python/dataloader_enospc.py");
    let cmd = private_shm(
        "size=64m",
        &format!(
            "exec {} {} {}",
            venv_python(),
            script.display(),
            truth.display()
        ),
    );
    let t = run_traced(&[], &cmd);
    let out = format!("{}{}", t.stdout(), t.stderr());
    assert!(
        out.contains("unable to allocate shared memory(shm)"),
        "PyTorch's own message:\n{out}"
    );
    let records = truth_lines(&truth);
    assert!(
        records.len() >= 2,
        "workers' own failure records: {records:?}\n{out}"
    );
    // Worker 2 ran ahead and failed ~2 s before the others.
    assert!(records[1].1 - records[0].1 > 500_000_000, "{records:?}");

    let f = t.first();
    assert_eq!(
        f["pid"].as_u64(),
        Some(records[0].0),
        "shmtrace vs the workers' own record:\n{}",
        t.stderr()
    );
    assert_eq!(f["kind"], "enospc");
    assert_eq!(f["syscall"], "fallocate");
    assert_eq!(f["errno"].as_i64(), Some(28));
    assert_eq!(
        f["bytes"].as_u64(),
        Some(32 << 20),
        "one batch of 2 x 16 MiB"
    );
    assert!(
        f["path"].as_str().unwrap().starts_with("/dev/shm/torch_"),
        "{f}"
    );
    assert_eq!(f["ppid"].as_u64(), Some(main_pid(&t.stdout())));
    // Its failure came before the later workers' in kernel time too.
    let later: Vec<u64> = t
        .failures()
        .iter()
        .skip(1)
        .map(|f| f["pid"].as_u64().unwrap())
        .collect();
    assert!(
        records[1..].iter().all(|r| later.contains(&r.0)),
        "later failures {later:?} vs {records:?}"
    );
    // The mount's peak is at least its use at the failure, though the
    // once-a-second samples may all have missed it.
    let used = f["mount"]["used_bytes"].as_u64().unwrap();
    let mount = t.report["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["dev"] == f["mount"]["dev"])
        .expect("the failing mount in mounts[]");
    assert!(
        mount["peak_used_bytes"].as_u64().unwrap() >= used,
        "peak {} below the use at the failure {used}",
        mount["peak_used_bytes"]
    );
    let _ = std::fs::remove_dir_all(dir);
}
