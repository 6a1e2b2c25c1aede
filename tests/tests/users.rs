//! Beyond the DataLoader: torch.multiprocessing, NCCL, Python's
//! shared_memory, PostgreSQL, leftover files, memory cgroups and CUDA IPC,
//! each with the real program where it runs here.

use serde_json::Value;
use shmtrace_tests::*;

const VENV: &str = "/var/cache/shmtrace/torch-venv/bin/python";

/// `run_traced` of `script` in a private mount namespace, inside a fresh
/// v1 memory cgroup limited to `limit` (removed afterwards), with that
/// cgroup's id (its directory's inode number).
fn in_memory_cgroup(name: &str, limit: &str, script: &str) -> (Traced, u64) {
    let cg = format!(
        "/sys/fs/cgroup/memory/shmtrace-test-{name}-{}",
        std::process::id()
    );
    std::fs::create_dir_all(&cg).expect("memory cgroup (v1 memory controller)");
    std::fs::write(format!("{cg}/memory.limit_in_bytes"), limit).unwrap();
    let id = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&cg).unwrap());
    let t = in_cgroup(&cg, script);
    let _ = std::fs::remove_dir(&cg);
    (t, id)
}

/// The memory cgroup ids the kernel put in `comm`'s events.
fn memcg_ids_of(t: &Traced, comm: &str) -> Vec<u64> {
    let mut ids: Vec<u64> = t
        .events
        .iter()
        .filter(|e| e["comm"] == comm)
        .filter_map(|e| e["memcg_id"].as_u64())
        .filter(|&id| id != 0)
        .collect();
    ids.dedup();
    ids
}

/// `run_traced` of `script` in a private mount namespace inside the
/// existing cgroup directory `cg`.
fn in_cgroup(cg: &str, script: &str) -> Traced {
    run_traced(
        &[],
        &[
            "sh".into(),
            "-c".into(),
            format!(
                "echo $$ > {cg}/cgroup.procs && exec unshare -m --propagation private sh -c '{script}'"
            ),
        ],
    )
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
    let (t, id) = in_memory_cgroup(
        "headroom",
        "48M",
        "mount -t tmpfs -o size=32m tmpfs /dev/shm && \
         exec dd if=/dev/zero of=/dev/shm/big bs=1M count=40",
    );
    let f = t.first();
    assert_eq!(f["kind"], "enospc", "{}", t.stderr());
    // The kernel names the cgroup in dd's open and its failure: dd may be
    // gone before /proc/PID/cgroup is read.
    assert_eq!(memcg_ids_of(&t, "dd"), vec![id], "{}", t.stderr());
    assert_eq!(
        f["memcg"]["limit_bytes"].as_u64(),
        Some(48 << 20),
        "{f}\n{}",
        t.stderr()
    );
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
    let caveat = d["caveat"].as_str().unwrap_or_else(|| {
        panic!(
            "the consumer (pid {consumer}) holds the bytes: {d}\nholders: {}\nfailures: {}\n{}",
            f["holders"],
            t.report["failures"],
            t.stderr()
        )
    });
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
    let (t, id) = in_memory_cgroup(
        "ahead",
        "24M",
        "mount -t tmpfs -o size=64m tmpfs /dev/shm && \
         dd if=/dev/zero of=/dev/shm/x bs=1M count=8 2>/dev/null && sleep 2.5",
    );
    assert!(t.first().is_null(), "no failure: {}", t.stderr());
    assert_eq!(memcg_ids_of(&t, "dd"), vec![id], "{}", t.stderr());
    let flagged: Vec<&Value> = t.report["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| !m["memory_headroom"].is_null())
        .collect();
    assert_eq!(
        flagged.len(),
        1,
        "only the job's /dev/shm: {flagged:?}\n{}",
        t.stderr()
    );
    let m = flagged[0];
    assert_eq!(m["mountpoint"], "/dev/shm");
    assert_eq!(m["size_bytes"].as_u64(), Some(64 << 20));
    let w = m["memory_headroom"].as_str().unwrap();
    assert!(w.contains("allows 24.0 MiB"), "{w}");
    // The figure the metric shmtrace_tmpfs_memory_room_bytes carries: the
    // limit less what the cgroup uses besides shared memory.
    let room = m["memory_room_bytes"].as_u64().unwrap();
    assert!(room > 16 << 20 && room <= 24 << 20, "{room}");
    assert!(w.contains("OOM killer strikes first"), "{w}");
    assert!(
        t.stderr().contains("warning        /dev/shm is 64.0 MiB"),
        "{}",
        t.stderr()
    );
}

/// The real CUDA runtime from PyPI's PyTorch: on this machine (no GPU)
/// cudaIpcGetMemHandle returns a real error code, which the uretprobe
/// shmtrace attaches once the library is mapped must capture as is.
#[test]
fn a_failed_cuda_ipc_call_is_captured_with_its_error_code() {
    let python = "/var/cache/shmtrace/torch-venv/bin/python";
    assert!(
        std::path::Path::new(python).exists(),
        "PyPI PyTorch venv missing: run scripts/setup.sh --test"
    );
    let script = root_dir().join("tests/python/cuda_ipc.py");
    let t = run_traced(&[], &[python.into(), script.display().to_string()]);
    let truth = truth(&t.stdout());
    let code = truth["error"].as_i64().unwrap();
    assert_ne!(code, 0, "cudaIpcGetMemHandle cannot succeed without a GPU");
    let f = t.first();
    assert_eq!(f["kind"], "cuda_ipc", "{}", t.stderr());
    assert_eq!(f["pid"], truth["pid"]);
    assert_eq!(f["syscall"], "cudaIpcGetMemHandle");
    assert!(
        f["cause"]
            .as_str()
            .unwrap()
            .contains(&format!("returned {code} (")),
        "{f}"
    );
    // The libraries it ran, from its /proc/PID/maps at the failure (the
    // workload loads libcudart alone, not libtorch).
    assert_eq!(f["libraries"], serde_json::json!(["libcudart"]), "{f}");
    let d = &t.report["diagnosis"];
    assert_eq!(d["signature"], "cuda-ipc:cudaIpcGetMemHandle", "{d}");
    assert!(
        d["recommended_shm_bytes"].is_null(),
        "never --shm-size: {d}"
    );
    assert!(d["docker"].is_null());
    assert!(
        d["fix"]
            .as_str()
            .unwrap()
            .contains("a bigger /dev/shm does not help"),
        "{d}"
    );
}

/// POSIX named semaphores (multiprocessing's locks): a /dev/shm another
/// file filled makes glibc's sem_open fail writing its page; the
/// semaphore is collateral and the filler is who held the bytes.
#[test]
fn a_full_dev_shm_breaks_multiprocessing_locks() {
    let script = root_dir().join("tests/python/sem_full.py");
    let t = run_traced(
        &[],
        &private_shm(
            "size=4m",
            &format!("exec /usr/bin/python3 {}", script.display()),
        ),
    );
    let truth = truth(&t.stdout());
    assert!(
        t.stderr().contains("No space left on device"),
        "Python's own error: {}",
        t.stderr()
    );
    let f = t.first();
    assert_eq!(f["pid"], truth["pid"], "{}", t.stderr());
    assert_eq!(f["syscall"], "write");
    assert!(
        f["path"].as_str().unwrap().starts_with("/dev/shm/sem."),
        "{f}"
    );
    let d = &t.report["diagnosis"];
    assert_eq!(d["signature"], "posix-semaphore:enospc-write", "{d}");
    assert!(
        d["framework_message"]
            .as_str()
            .unwrap()
            .contains("multiprocessing.Lock"),
        "{d}"
    );
    let filler = truth["filler_bytes"].as_u64().unwrap();
    assert!(
        f["holders"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["pid"] == truth["pid"] && h["held_bytes"].as_u64() >= Some(filler)),
        "the filler's bytes are attributed: {f}"
    );
}

/// The same in a Kubernetes-shaped memory cgroup (cgroupfs driver:
/// /kubepods/burstable/pod<uid>/<container id>, real v1 memory cgroups made
/// here; no kubelet): the pod's limit is the mount's size, so the warning
/// says Kubernetes sized the emptyDir at the pod's limit.
#[test]
fn a_pod_sized_emptydir_says_which_kubernetes_rule_made_it() {
    let root = "/sys/fs/cgroup/memory/kubepods";
    let pod = format!(
        "{root}/burstable/pod0f6b7c1e-2d3a-4b5c-8d9e-{:012x}",
        std::process::id()
    );
    let cg = format!("{pod}/{:064x}", std::process::id());
    std::fs::create_dir_all(&cg).expect("memory cgroup (v1 memory controller)");
    std::fs::write(format!("{pod}/memory.limit_in_bytes"), "64M").unwrap();
    std::fs::write(format!("{cg}/memory.limit_in_bytes"), "24M").unwrap();
    let t = in_cgroup(
        &cg,
        "mount -t tmpfs -o size=64m tmpfs /dev/shm && \
         dd if=/dev/zero of=/dev/shm/x bs=1M count=8 2>/dev/null && sleep 2.5",
    );
    for d in [
        cg.as_str(),
        pod.as_str(),
        &format!("{root}/burstable"),
        root,
    ] {
        let _ = std::fs::remove_dir(d);
    }
    let m = t.report["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| !m["memory_headroom"].is_null())
        .unwrap_or_else(|| panic!("flagged: {}\n{}", t.report["mounts"], t.stderr()));
    let w = m["memory_headroom"].as_str().unwrap();
    assert!(w.contains("allows 24.0 MiB"), "{w}");
    assert!(
        w.contains("Kubernetes sized this Memory emptyDir at the pod's memory limit (64.0 MiB)"),
        "{w}"
    );
}

/// Ray's object store, the real package from PyPI: the raylet maps a
/// sparse, unlinked plasma file; another process then takes every free
/// byte (tests/python/ray_full.py); the raylet dies of SIGBUS at the next
/// ray.put(). Named as Ray's, by the raylet's name, with Ray's settings.
#[test]
fn ray_object_store_raylet_dies_of_sigbus_in_a_full_dev_shm() {
    let python = "/var/cache/shmtrace/ray-venv/bin/python";
    assert!(
        std::path::Path::new(python).exists(),
        "Ray venv missing: run scripts/setup.sh --test"
    );
    let script = root_dir().join("tests/python/ray_full.py");
    let t = run_traced(
        &[],
        &private_shm("size=64m", &format!("exec {python} {}", script.display())),
    );
    let truth = truth(&t.stdout());
    let f = t.first();
    assert_eq!(f["kind"], "sigbus", "{}", t.stderr());
    assert_eq!(f["comm"], "raylet", "named by its main thread: {f}");
    assert!(
        f["path"].as_str().unwrap().starts_with("/dev/shm/plasma"),
        "{f}"
    );
    let d = &t.report["diagnosis"];
    assert_eq!(d["signature"], "ray-object-store:sigbus", "{d}");
    assert!(
        d["framework_message"].as_str().unwrap().contains("raylet"),
        "{d}"
    );
    assert!(
        d["knobs"].as_str().unwrap().contains("object_store_memory"),
        "{d}"
    );
    // The filler exited holding its file: a leftover, by its pid.
    let left = d["leftovers"].as_str().unwrap();
    assert!(
        left.contains("/dev/shm/filler ") && left.contains(&format!("pid {}", truth["filler"])),
        "{left}"
    );
}

/// Debian's PostgreSQL 15 in a private 32 MiB /dev/shm (Docker's default
/// is 64 MiB), a fresh cluster of its own, one parallel hash join whose
/// dynamic shared memory does not fit: `could not resize shared memory
/// segment "/PostgreSQL.N"` in the client, from whichever backend it relays.
const POSTGRES: &str = r#"set -e
D=$(mktemp -d /tmp/shmtrace-pg-XXXXXX); chown postgres "$D"
B=/usr/lib/postgresql/15/bin
pg() { runuser -u postgres -- "$@"; }
pg $B/initdb -D "$D/data" -A trust > /dev/null
pg $B/pg_ctl -D "$D/data" -l "$D/log" -w -o "-k $D -c listen_addresses= -c max_parallel_workers_per_gather=2 -c parallel_setup_cost=0 -c parallel_tuple_cost=0 -c min_parallel_table_scan_size=0 -c work_mem=64MB -c hash_mem_multiplier=4" start > /dev/null
pg psql -X -q -h "$D" -d postgres -c "create table a as select g as x, repeat('x', 100) as y from generate_series(1, 600000) g; analyze a;"
set +e
pg psql -X -q -h "$D" -d postgres -c "select count(*) from a t1 join a t2 using (x);" 2> "$D/client.err"
rc=$?
cat "$D/client.err" >&2
grep -o 'PostgreSQL\.[0-9]*' "$D/client.err" | head -1
pg $B/pg_ctl -D "$D/data" -m fast -w stop > /dev/null
rm -rf "$D"
exit $rc"#;

#[test]
fn postgres_parallel_hash_join_is_diagnosed_as_postgres_dynamic_shared_memory() {
    let t = run_traced(&[], &private_shm("size=32m", POSTGRES));
    let err = t.stderr();
    assert!(
        err.contains("could not resize shared memory segment"),
        "the real failure: {err}"
    );
    // The client names the segment of the backend whose error it relays.
    let relayed = t.stdout().trim().to_string();
    assert!(relayed.starts_with("PostgreSQL."), "{relayed}");
    let failures = t.failures();
    let f = t.first();
    // The kernel's order: the first failure is the earliest, a postgres
    // process (a parallel worker or the leader), on a DSM segment.
    let ts: Vec<u64> = failures
        .iter()
        .map(|f| f["ts_ns"].as_u64().unwrap())
        .collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{ts:?}");
    assert_eq!(f["pid"], failures[0]["pid"], "{err}");
    assert_eq!(f["comm"], "postgres", "{f}");
    assert_eq!(f["kind"], "enospc", "{f}");
    assert_eq!(f["syscall"], "fallocate", "{f}");
    assert!(
        f["path"]
            .as_str()
            .unwrap()
            .starts_with("/dev/shm/PostgreSQL."),
        "{f}"
    );
    assert!(
        failures
            .iter()
            .any(|x| x["path"].as_str() == Some(&format!("/dev/shm/{relayed}"))),
        "the relayed segment is among the failures: {relayed}"
    );
    let d = &t.report["diagnosis"];
    assert_eq!(d["signature"], "postgresql-dsm:enospc-fallocate", "{d}");
    assert_eq!(d["framework"], "PostgreSQL dynamic shared memory");
    assert!(
        d["framework_message"]
            .as_str()
            .unwrap()
            .contains("could not resize shared memory segment"),
        "{d}"
    );
    let knobs = d["knobs"].as_str().unwrap();
    for k in [
        "dynamic_shared_memory_type",
        "work_mem",
        "max_parallel_workers_per_gather",
    ] {
        assert!(knobs.contains(k), "{k}: {knobs}");
    }
    // 32 MiB did not hold it: a bigger size, and the docker flag.
    assert!(
        d["recommended_shm_bytes"].as_u64().unwrap() > 32 << 20,
        "{d}"
    );
    assert!(d["docker"].as_str().unwrap().contains("--shm-size="), "{d}");
    // The workers share their segments: no hoard, no PyTorch rule.
    assert!(d["caveat"].is_null(), "{d}");
    let report = t.report.to_string();
    for word in ["PyTorch", "DataLoader", "prefetch", "pid order"] {
        assert!(!err.contains(word), "{word} in the summary:\n{err}");
        assert!(!report.contains(word), "{word} in the report");
    }
}
