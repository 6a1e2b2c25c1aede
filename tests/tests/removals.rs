//! Segments found gone: a consumer's open fails with "No such file or
//! directory" because something removed the segment first. shmtrace names
//! the remover (the framework cannot), with real Python and PyTorch.

use serde_json::Value;
use shmtrace_tests::*;

fn segment_gone(mode: &str, python: &str) -> (Traced, Value) {
    let script = root_dir().join("tests/python/segment_gone.py");
    let cmd = private_shm(
        "size=16m",
        &format!("exec {python} {} {mode}", script.display()),
    );
    let t = run_traced(&[], &cmd);
    let truth = truth(&t.stdout());
    (t, truth)
}

/// The failure is the consumer's open, and `removed_by` is the `rm` the
/// workload ran, by pid.
fn assert_removed_by_rm(t: &Traced, truth: &Value) {
    let f = t.first();
    assert_eq!(f["kind"], "enoent", "{}", t.stderr());
    assert_eq!(f["reason"], "segment_gone");
    assert_eq!(f["pid"], truth["consumer"], "{}", t.stderr());
    let name = truth["name"].as_str().unwrap();
    assert_eq!(f["path"], format!("/dev/shm/{name}"));
    let by = &f["removed_by"];
    assert_eq!(by["pid"], truth["remover"], "{f}");
    assert_eq!(by["comm"], "rm");
    assert_eq!(by["path"], format!("/dev/shm/{name}"));
    assert!(by["ts_ns"].as_u64().unwrap() <= f["ts_ns"].as_u64().unwrap());
    assert!(
        f["cause"]
            .as_str()
            .unwrap()
            .contains(&format!("by pid {} (rm)", truth["remover"])),
        "{f}"
    );
    // The unlink is among the last events on the mount.
    assert!(
        f["events_before"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().unwrap().contains(&format!("(rm) unlink {name}"))),
        "{f}"
    );
    let d = &t.report["diagnosis"];
    assert!(
        d["recommended_shm_bytes"].is_null(),
        "no size fixes it: {d}"
    );
    assert!(d["fix"].as_str().unwrap().contains("cleanup"), "{d}");
    // The summary says it in words.
    assert!(t.stderr().contains("(rm)"), "{}", t.stderr());
}

#[test]
fn python_shared_memory_found_gone_names_who_removed_it() {
    let (t, truth) = segment_gone("psm", "/usr/bin/python3");
    assert!(
        t.stdout().contains("FileNotFoundError") || t.stderr().contains("FileNotFoundError"),
        "Python's own error: {}",
        t.stderr()
    );
    assert_removed_by_rm(&t, &truth);
    let d = &t.report["diagnosis"];
    assert_eq!(d["signature"], "python-shared-memory:segment-gone", "{d}");
    assert!(
        d["framework_message"]
            .as_str()
            .unwrap()
            .contains("FileNotFoundError"),
        "{d}"
    );
}

/// torch.multiprocessing's file_system strategy keeps segment names; a
/// cleanup removes them while a tensor is on a Queue; PyTorch 1.13
/// (Debian) raises "unable to open shared memory object".
#[test]
fn torch_file_system_strategy_segment_removed_before_the_consumer_opened_it() {
    let (t, truth) = segment_gone("torch", "/usr/bin/python3");
    assert!(
        t.stderr()
            .contains("unable to open shared memory object </torch_"),
        "PyTorch's own error: {}",
        t.stderr()
    );
    assert_removed_by_rm(&t, &truth);
    let d = &t.report["diagnosis"];
    assert_eq!(
        d["signature"], "pytorch-multiprocessing:segment-gone",
        "{d}"
    );
    assert!(
        d["framework_message"]
            .as_str()
            .unwrap()
            .contains("unable to open shared memory object"),
        "{d}"
    );
    assert!(
        !d["summary"].as_str().unwrap().contains("DataLoader worker"),
        "a consumer is no worker: {d}"
    );
    // Evidence from /proc/PID/maps, read at the failure.
    let libs = t.first()["libraries"].as_array().unwrap();
    assert!(libs.iter().any(|l| l == "libtorch"), "{libs:?}");
}

/// Attach-or-create: SharedMemory(name) fails, then the process creates
/// the name. That lookup is no failure.
#[test]
fn a_lookup_followed_by_creating_the_name_is_no_failure() {
    let (t, _) = segment_gone("probe", "/usr/bin/python3");
    assert!(t.output.status.success(), "{}", t.stderr());
    assert!(t.first().is_null(), "{}", t.report["first_failure"]);
    assert!(t.failures().is_empty(), "{:?}", t.failures());
    // Its open was seen (the event exists), then withdrawn.
    assert!(
        t.events
            .iter()
            .any(|e| e["event"] == "syscall_error" && e["errno"] == 2),
        "the ENOENT open was captured"
    );
}
