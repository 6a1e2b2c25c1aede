//! `shmtrace demo`: the built-in reproduction fails for real and is diagnosed.

use std::process::Command;

use shmtrace_tests::*;

#[test]
fn demo_reproduces_and_names_the_first_failing_worker() {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("demo");
    let report = dir.join("r.json");
    let out = Command::new(shmtrace())
        .args(["demo", "--report"])
        .arg(&report)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The trainer failed like a DataLoader job; the demo itself succeeded.
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("the demo job itself exited with status 1"),
        "{stderr}"
    );
    let blamed: u64 = stdout
        .split("DataLoader worker (pid ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the trainer's message:\n{stdout}"));
    let r: serde_json::Value = read_report(&report);
    let f = &r["first_failure"];
    assert_eq!(f["kind"], "sigbus");
    assert!(
        f["path"]
            .as_str()
            .unwrap()
            .starts_with("/dev/shm/shmtrace_demo_")
    );
    assert_eq!(f["mount"]["size_bytes"].as_u64(), Some(64 << 20));
    // Worker 0 starts late: the trainer blames it (lowest pid), but another
    // worker failed first, and the blamed one is among the later failures.
    assert_ne!(f["pid"].as_u64(), Some(blamed), "{stderr}");
    assert!(
        r["failures"]
            .as_array()
            .unwrap()
            .iter()
            .skip(1)
            .any(|g| g["pid"].as_u64() == Some(blamed))
    );
    assert!(
        stderr.contains("the first process to fail was pid"),
        "{stderr}"
    );
    // The trainer keeps every batch: the diagnosis says a bigger /dev/shm
    // would not be the fix.
    let d = &r["diagnosis"];
    assert_eq!(d["signature"], "shm:sigbus");
    assert!(
        d["caveat"].as_str().unwrap_or("").contains("demo_trainer"),
        "{d}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
