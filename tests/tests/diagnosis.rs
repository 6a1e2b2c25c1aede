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
    (out, serde_json::from_str(&text).unwrap())
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
    assert!(text.contains("Docker's and Kubernetes' default"), "{text}");
}

/// NCCL's shared-memory transport (its calls and file names, without a
/// GPU: tests/workloads/nccl_shm.c): named as NCCL, with what NCCL prints
/// and its own settings beside the size.
#[test]
fn an_nccl_segment_that_does_not_fit_is_diagnosed_as_nccl() {
    let exe = workload("nccl_shm");
    let cmd = private_shm("size=8m", &format!("exec {} {}", exe.display(), 32 << 20));
    let t = run_traced(&[], &cmd);
    let truth = truth(&t.stdout());
    let f = t.first();
    assert_eq!(f["pid"], truth["pid"], "{}", t.stderr());
    assert_eq!(f["syscall"], "fallocate");
    assert_eq!(f["path"], truth["path"]);
    let d = &t.report["diagnosis"];
    assert_eq!(d["signature"], "nccl:enospc-fallocate", "{d}");
    assert_eq!(d["framework"], "NCCL");
    assert!(
        d["framework_message"]
            .as_str()
            .unwrap()
            .contains("failed to extend /dev/shm/nccl-XXXXXX"),
        "{d}"
    );
    assert!(
        d["knobs"].as_str().unwrap().contains("NCCL_SHM_DISABLE=1"),
        "{d}"
    );
    assert!(d["dataloader"].is_null(), "no DataLoader advice: {d}");
    // 32 MiB asked on an 8 MiB /dev/shm: the size covers the request.
    assert!(d["recommended_shm_bytes"].as_u64().unwrap() >= 32 << 20);
    assert!(
        t.stderr().contains("NCCL_SHM_DISABLE=1"),
        "the summary shows the knob: {}",
        t.stderr()
    );
}

/// Files an earlier process left in /dev/shm and nobody holds are named,
/// with whose they were and the command that removes them; what the job
/// itself needed is computed without them (here it fits the size it has).
#[test]
fn leftover_files_of_exited_processes_are_subtracted_and_named() {
    let cmd = private_shm(
        "size=8m",
        "dd if=/dev/zero of=/dev/shm/left1 bs=1M count=5 2>/dev/null; sleep 0.3; \
         exec dd if=/dev/zero of=/dev/shm/job bs=1M count=6",
    );
    let t = run_traced(&[], &cmd);
    let f = t.first();
    assert_eq!(f["path"], "/dev/shm/job", "{}", t.stderr());
    let d = &t.report["diagnosis"];
    let left = d["leftovers"].as_str().expect("leftovers named");
    assert!(
        left.contains("/dev/shm/left1 (5.0 MiB, made by pid"),
        "{left}"
    );
    assert!(left.contains("(dd)"), "{left}");
    assert!(left.ends_with("rm -- /dev/shm/left1"), "{left}");
    // 3 MiB of the job's own + 1 MiB asked fit 8 MiB without the 5 MiB left.
    assert!(d["recommended_shm_bytes"].is_null(), "{d}");
    assert!(
        d["basis"]
            .as_str()
            .unwrap()
            .contains("once the 5.0 MiB of leftover files are removed"),
        "{d}"
    );
    assert!(
        d["summary"]
            .as_str()
            .unwrap()
            .contains("Removing them is enough"),
        "{d}"
    );
    assert!(
        t.stderr().contains("leftovers      1 file(s)"),
        "{}",
        t.stderr()
    );
    // The report lists them per mount: name, bytes, creator. By the end the
    // failing dd's file is one too (it exited without removing it).
    let mount = t.report["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["dev"] == f["dev"])
        .expect("the failing mount");
    assert_eq!(mount["leftover_bytes"].as_u64(), Some(8 << 20), "{mount}");
    let l = &mount["leftovers"][0];
    assert_eq!(
        (l["name"].as_str(), l["creator_comm"].as_str()),
        (Some("left1"), Some("dd")),
        "{l}"
    );
    assert_eq!(l["bytes"].as_u64(), Some(5 << 20));
}

/// /dev/shm pages count against the writer's memory cgroup: a size it
/// cannot hold is no fix, and the diagnosis says so ahead of the OOM kill.
#[test]
fn a_size_beyond_the_memory_limit_is_flagged() {
    let cg = format!(
        "/sys/fs/cgroup/memory/shmtrace-test-headroom-{}",
        std::process::id()
    );
    std::fs::create_dir_all(&cg).expect("memory cgroup (v1 memory controller)");
    std::fs::write(format!("{cg}/memory.limit_in_bytes"), "48M").unwrap();
    let t = run_traced(
        &[],
        &[
            "sh".into(),
            "-c".into(),
            format!(
                "echo $$ > {cg}/cgroup.procs && exec unshare -m --propagation private sh -c \
                 'mount -t tmpfs -o size=32m tmpfs /dev/shm && \
                 exec dd if=/dev/zero of=/dev/shm/big bs=1M count=40'"
            ),
        ],
    );
    let _ = std::fs::remove_dir(&cg);
    let f = t.first();
    assert_eq!(f["kind"], "enospc", "{}", t.stderr());
    assert_eq!(f["memcg"]["limit_bytes"].as_u64(), Some(48 << 20), "{f}");
    let d = &t.report["diagnosis"];
    // 32 MiB + 1 MiB asked, +25%, rounded: 64 MiB, more than 48 MiB allows.
    assert_eq!(d["recommended_shm_bytes"].as_u64(), Some(64 << 20), "{d}");
    let m = d["memory_limit"]
        .as_str()
        .expect("the memory limit is flagged");
    assert!(m.contains("allows 48.0 MiB"), "{m}");
    assert!(m.contains("OOM killer strikes first"), "{m}");
    assert!(
        t.stderr().contains("memory limit   the failing process"),
        "{}",
        t.stderr()
    );
}

/// torch.multiprocessing without a DataLoader (tests/python/mp_keep.py):
/// producers pass tensors through a Queue to a consumer that keeps them.
/// Named as such, with PyTorch's message, the caveat that the consumer
/// holds the bytes, and no DataLoader advice; with both PyTorch versions.
fn multiprocessing_consumer_that_keeps(python: &str, what: &str) {
    let script = root_dir().join("tests/python/mp_keep.py");
    let t = run_traced(
        &[],
        &private_shm("size=64m", &format!("exec {python} {}", script.display())),
    );
    let truth = truth(&t.stdout());
    let f = t.first();
    let producers: Vec<u64> = truth["producers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    assert!(
        producers.contains(&f["pid"].as_u64().unwrap()),
        "a producer fails first: {}",
        t.stderr()
    );
    let d = &t.report["diagnosis"];
    assert_eq!(
        d["signature"],
        format!("pytorch-multiprocessing:{what}"),
        "{d}"
    );
    assert_eq!(d["framework"], "PyTorch torch.multiprocessing");
    assert!(d["dataloader"].is_null(), "no DataLoader advice: {d}");
    assert!(
        !d["basis"]
            .as_str()
            .unwrap()
            .contains("DataLoader steady state"),
        "{d}"
    );
    assert!(d["knobs"].as_str().unwrap().contains("clone()"), "{d}");
    let consumer = truth["consumer"].as_u64().unwrap();
    let caveat = d["caveat"].as_str().expect("the consumer holds the bytes");
    assert!(caveat.contains(&format!("pid {consumer} ")), "{caveat}");
    assert!(
        caveat.contains("what a DataLoader with as many workers keeps"),
        "{caveat}"
    );
}

#[test]
fn debian_torch_multiprocessing_consumer_that_keeps_tensors() {
    multiprocessing_consumer_that_keeps("/usr/bin/python3", "sigbus");
}

#[test]
fn pypi_torch_multiprocessing_consumer_that_keeps_tensors() {
    multiprocessing_consumer_that_keeps(VENV, "enospc-fallocate");
}

/// Before any failure: a /dev/shm larger than what its writers' memory
/// cgroup leaves for shared memory is flagged on the mount (it can never
/// fill: the pod is OOM-killed first).
#[test]
fn a_mount_its_writers_memory_limit_cannot_fill_is_flagged_before_any_failure() {
    let cg = format!(
        "/sys/fs/cgroup/memory/shmtrace-test-ahead-{}",
        std::process::id()
    );
    std::fs::create_dir_all(&cg).expect("memory cgroup (v1 memory controller)");
    std::fs::write(format!("{cg}/memory.limit_in_bytes"), "24M").unwrap();
    let t = run_traced(
        &[],
        &[
            "sh".into(),
            "-c".into(),
            format!(
                "echo $$ > {cg}/cgroup.procs && exec unshare -m --propagation private sh -c \
                 'mount -t tmpfs -o size=64m tmpfs /dev/shm && \
                 dd if=/dev/zero of=/dev/shm/x bs=1M count=8 2>/dev/null && sleep 2.5'"
            ),
        ],
    );
    let _ = std::fs::remove_dir(&cg);
    assert!(t.first().is_null(), "no failure: {}", t.stderr());
    let flagged: Vec<&Value> = t.report["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| !m["memory_headroom"].is_null())
        .collect();
    assert_eq!(flagged.len(), 1, "only the job's /dev/shm: {flagged:?}");
    let m = flagged[0];
    assert_eq!(m["mountpoint"], "/dev/shm");
    assert_eq!(m["size_bytes"].as_u64(), Some(64 << 20));
    let w = m["memory_headroom"].as_str().unwrap();
    assert!(w.contains("allows 24.0 MiB"), "{w}");
    assert!(w.contains("OOM killer strikes first"), "{w}");
    assert!(
        t.stderr().contains("warning        /dev/shm is 64.0 MiB"),
        "{}",
        t.stderr()
    );
}
