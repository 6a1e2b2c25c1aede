//! Failures on an empty /dev/shm whose cause is a limit, a mount option or
//! the fd table: each is reported as what it is, with its own fix, and no
//! bigger /dev/shm is prescribed.

use serde_json::Value;
use shmtrace_tests::*;

/// Runs tests/workloads/causes.c in MODE on a private 64 MiB /dev/shm
/// mounted with OPTS; returns the report and the workload's truth.
fn cause(mode: &str, opts: &str) -> (Traced, Value) {
    let exe = workload("causes");
    let t = run_traced(
        &[],
        &private_shm(opts, &format!("exec {} {mode} /dev/shm", exe.display())),
    );
    let truth = truth(&t.stdout());
    assert_ne!(truth["errno"].as_i64(), Some(0), "the call failed: {truth}");
    (t, truth)
}

/// The first failure and the diagnosis, checked for what every such case
/// shares: its reason, no /dev/shm size, and a fix naming `fix_has`.
fn check(t: &Traced, reason: &str, errno: i64, fix_has: &str) -> Value {
    let f = t.first().clone();
    assert_eq!(f["reason"], reason, "{f}\n{}", t.stderr());
    assert_eq!(f["errno"].as_i64(), Some(errno), "{f}");
    let d = &t.report["diagnosis"];
    assert_eq!(
        d["signature"],
        format!("shm:{}", reason.replace('_', "-")),
        "{d}"
    );
    assert!(
        d["recommended_shm_bytes"].is_null(),
        "no /dev/shm size: {d}"
    );
    assert!(d["docker"].is_null() && d["kubernetes"].is_null(), "{d}");
    assert!(
        d["fix"].as_str().unwrap_or_default().contains(fix_has),
        "fix: {d}"
    );
    assert!(
        d["summary"].as_str().unwrap().contains("did not run out"),
        "{d}"
    );
    assert!(!t.stderr().contains("should be enough"), "{}", t.stderr());
    f
}

#[test]
fn mmap_under_rlimit_as_is_the_address_space_limit_not_shm() {
    let (t, truth) = cause("as", "size=64m");
    let f = check(&t, "address_space_limit", 12, "ulimit -v");
    assert_eq!(f["kind"], "mmap_error");
    assert_eq!(f["limit"]["name"], "RLIMIT_AS");
    assert_eq!(f["limit"]["value"].as_i64(), truth["limit"].as_i64());
    assert_eq!(f["bytes"].as_u64(), Some(128 << 20));
}

#[test]
fn exec_mapping_on_a_noexec_mount_is_the_mount_option() {
    let (t, _) = cause("noexec", "size=64m,noexec");
    let f = check(&t, "noexec", 1, "noexec");
    assert!(f["cause"].as_str().unwrap().contains("PROT_EXEC"), "{f}");
}

#[test]
fn a_write_past_rlimit_fsize_is_the_file_size_limit() {
    let (t, truth) = cause("fsize", "size=64m");
    let f = check(&t, "file_size_limit", 27, "ulimit -f");
    assert_eq!(f["limit"]["value"].as_i64(), truth["limit"].as_i64());
    assert_eq!(f["path"].as_str(), Some("/dev/shm/seg"));
}

#[test]
fn running_out_of_fds_is_the_fd_limit_and_the_sharing_strategy() {
    let (t, truth) = cause("emfile", "size=64m");
    let f = check(&t, "fd_limit", 24, "file_system");
    assert_eq!(f["limit"]["name"], "RLIMIT_NOFILE");
    assert_eq!(f["limit"]["value"].as_i64(), truth["limit"].as_i64());
}
