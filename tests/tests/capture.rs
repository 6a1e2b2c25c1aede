//! Failures on a full tmpfs, in an order the workload controls: the first
//! failing worker is neither the lowest pid nor the first forked.

use shmtrace_tests::*;

const WORKERS: usize = 5;
const FIRST: usize = 3;
const SEG: u64 = 4 << 20;

/// Runs tests/workloads/order.c in MODE under shmtrace and checks the
/// report against the workload's own record of the order.
fn ordered(mode: &str) -> (Traced, Vec<u64>, Vec<u64>) {
    let order = workload("order");
    let script = format!(
        "exec {} {mode} /dev/shm {WORKERS} {FIRST} {SEG}",
        order.display()
    );
    let t = run_traced(&[], &private_shm("size=8m", &script));
    let truth = truth(&t.stdout());
    let order = pids(&truth["order"]);
    let pids = pids(&truth["pids"]);
    assert_eq!(order.len(), WORKERS, "workload truth: {truth}");
    // The truth itself is what the test wants: not lowest, not first forked.
    assert_eq!(order[0], pids[FIRST]);
    assert_ne!(order[0], *pids.iter().min().unwrap());

    let failures = t.failures();
    assert!(
        failures.len() >= WORKERS,
        "one failure per worker at least:\n{}",
        t.stderr()
    );
    let first = t.first();
    assert_eq!(
        first["pid"].as_u64(),
        Some(order[0]),
        "first failure:\n{}",
        t.stderr()
    );
    assert_eq!(
        first["path"].as_str(),
        Some(format!("/dev/shm/w{FIRST}").as_str())
    );
    let ppid = first["ppid"].as_u64().unwrap();
    assert!(
        t.report["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"].as_u64() == Some(ppid))
    );
    // Later failures: in time order, each worker in the order it was released.
    let mut seen = Vec::new();
    let mut last_ts = 0;
    for f in failures {
        let ts = f["ts_ns"].as_u64().unwrap();
        assert!(ts >= last_ts, "failures are in kernel time order");
        last_ts = ts;
        let pid = f["pid"].as_u64().unwrap();
        if !seen.contains(&pid) {
            seen.push(pid);
        }
    }
    assert_eq!(
        seen, order,
        "failing workers in the order the workload released them"
    );
    // The mount at the moment of the first failure.
    assert_eq!(first["mount"]["mountpoint"].as_str(), Some("/dev/shm"));
    assert_eq!(first["mount"]["size_bytes"].as_u64(), Some(8 << 20));
    assert_eq!(t.report["schema"].as_u64(), Some(2));
    assert_eq!(t.report["lost_events"].as_u64(), Some(0));
    (t, pids, order)
}

#[test]
fn sigbus_from_page_fault_names_the_first_worker() {
    let (t, _, _) = ordered("sigbus");
    let f = t.first();
    assert_eq!(f["kind"], "sigbus");
    assert_eq!(f["signal"].as_i64(), Some(7));
    assert_eq!(f["si_code"].as_i64(), Some(2), "BUS_ADRERR");
    assert_eq!(f["si_code_name"], "BUS_ADRERR");
    // Half a segment was free: the fault is on the first page past it.
    let off = f["offset"].as_u64().unwrap();
    assert!(off > 0 && off < SEG, "offset {off} inside the 4 MiB file");
    assert_eq!(off % 4096, 0);
    assert!(f["fault_addr"].as_str().unwrap().starts_with("0x"));
    assert!(f["syscall"].is_null() && f["errno"].is_null());
    let p = t.report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == f["pid"])
        .unwrap()
        .clone();
    assert_eq!(
        p["exit_signal"].as_i64(),
        Some(7),
        "the worker died of SIGBUS"
    );
    assert!(t.stderr().contains("SIGBUS (BUS_ADRERR)"), "{}", t.stderr());
}

#[test]
fn enospc_from_fallocate() {
    let (t, _, _) = ordered("fallocate");
    let f = t.first();
    assert_eq!(f["kind"], "enospc");
    assert_eq!(f["syscall"], "fallocate");
    assert_eq!(f["errno"].as_i64(), Some(28));
    assert_eq!(f["offset"].as_u64(), Some(0));
    assert_eq!(f["bytes"].as_u64(), Some(SEG));
    assert!(f["signal"].is_null());
    // Less than half a segment was free when it failed.
    assert!(f["mount"]["free_bytes"].as_u64().unwrap() < SEG);
}

#[test]
fn enospc_from_write() {
    let (t, _, _) = ordered("write");
    let f = t.first();
    assert_eq!(f["kind"], "enospc");
    assert_eq!(f["syscall"], "write");
    assert_eq!(f["bytes"].as_u64(), Some(65536));
    // It had written about half a segment when the tmpfs ran out.
    let off = f["offset"].as_u64().unwrap();
    assert!(off > 0 && off <= SEG / 2 + 65536, "offset {off}");
}

#[test]
fn enospc_from_pwrite() {
    let (t, _, _) = ordered("pwrite");
    assert_eq!(t.first()["syscall"], "pwrite64");
    assert_eq!(t.first()["kind"], "enospc");
}

#[test]
fn enospc_from_openat_at_the_inode_limit() {
    let exe = workload("inodes");
    let t = run_traced(
        &[],
        &private_shm("size=8m,nr_inodes=8", &format!("exec {}", exe.display())),
    );
    let truth = truth(&t.stdout());
    assert_eq!(
        truth["errno"].as_i64(),
        Some(28),
        "the workload hit ENOSPC: {truth}"
    );
    let f = t.first();
    assert_eq!(f["kind"], "enospc");
    assert_eq!(f["syscall"], "openat");
    assert_eq!(f["path"].as_str(), truth["path"].as_str());
    assert_eq!(f["pid"].as_u64(), truth["pid"].as_u64());
    assert!(f["cause"].as_str().unwrap().contains("inode limit"), "{f}");
}

#[test]
fn mmap_error_on_a_tmpfs_fd() {
    let exe = workload("mmap_error");
    // Gone within milliseconds, its namespace with it: the mount point
    // comes from the kernel's record, not the mount table.
    let t = run_traced(
        &[],
        &private_shm("size=8m", &format!("NO_LINGER=1 exec {}", exe.display())),
    );
    let truth = truth(&t.stdout());
    let f = t.first();
    assert_eq!(f["kind"], "mmap_error");
    assert_eq!(f["syscall"], "mmap");
    assert_eq!(f["errno"].as_i64(), truth["errno"].as_i64());
    assert_eq!(f["errno"].as_i64(), Some(12));
    assert_eq!(f["bytes"].as_u64(), Some(1 << 30));
    assert_eq!(f["path"].as_str(), Some("/dev/shm/big"));
}

#[test]
fn python_shared_memory_sigbus() {
    let dir = scratch("py");
    let script = dir.join("shm.py");
    std::fs::write(
        &script,
        "import json\nfrom multiprocessing import shared_memory as s\n\
         m = s.SharedMemory(create=True, size=16 << 20)\n\
         print(json.dumps({'name': m.name}), flush=True)\n\
         m.buf[:] = b'x' * (16 << 20)\n",
    )
    .unwrap();
    let cmd = private_shm(
        "size=4m",
        &format!("exec /usr/bin/python3 {}", script.display()),
    );
    let t = run_traced(&[], &cmd);
    let truth = truth(&t.stdout());
    let f = t.first();
    assert_eq!(f["kind"], "sigbus", "{}", t.stderr());
    assert_eq!(
        f["path"].as_str().unwrap(),
        format!(
            "/dev/shm/{}",
            truth["name"].as_str().unwrap().trim_start_matches('/')
        )
    );
    // 4 MiB fit; the first page past them faulted.
    assert!(f["offset"].as_u64().unwrap() <= 4 << 20);
    // Named as Python's shared_memory, with how it dies and what helps.
    let d = &t.report["diagnosis"];
    assert_eq!(d["signature"], "python-shared-memory:sigbus", "{d}");
    assert_eq!(d["framework"], "Python multiprocessing.shared_memory");
    assert!(
        d["framework_message"]
            .as_str()
            .unwrap()
            .contains("exitcode -7")
    );
    assert!(d["knobs"].as_str().unwrap().contains(".unlink()"), "{d}");
    // shmtrace exits as the command did: killed by SIGBUS.
    assert_eq!(t.output.status.code(), Some(128 + 7));
}

#[test]
fn a_clean_run_reports_no_failure_and_passes_the_exit_code() {
    let t = run_traced(
        &[],
        &["sh".into(), "-c".into(), "echo hello; exit 3".into()],
    );
    assert_eq!(t.output.status.code(), Some(3));
    assert_eq!(t.stdout().trim(), "hello");
    assert!(t.first().is_null());
    assert_eq!(t.failures().len(), 0);
    assert!(
        t.stderr().contains("no shared-memory failure"),
        "{}",
        t.stderr()
    );
    assert_eq!(t.report["exit"]["code"].as_i64(), Some(3));
}

#[test]
fn a_flood_of_ordinary_events_loses_context_but_never_the_failure() {
    let exe = workload("flood");
    // One page of ring for ordinary events: the flood cannot fit.
    let t = run_traced(
        &["--events-ring", "4k"],
        &private_shm("size=8m", &format!("exec {} 20000", exe.display())),
    );
    let pid = truth(&t.stdout())["pid"].as_u64().unwrap();
    let lost = t.report["lost"]["events_ring"].as_u64().unwrap();
    assert!(
        lost > 0,
        "the flood overflowed the small ring: {}",
        t.report["lost"]
    );
    assert_eq!(t.report["lost"]["failures_ring"].as_u64(), Some(0));
    assert_eq!(t.report["lost_events"].as_u64(), Some(lost));
    let f = t.first();
    assert_eq!(f["pid"].as_u64(), Some(pid));
    assert_eq!(f["syscall"], "fallocate");
    assert_eq!(f["kind"], "enospc");
    assert!(
        t.stderr().contains("LOST EVENTS"),
        "losses are shown: {}",
        t.stderr()
    );
}

#[test]
fn under_sudo_the_command_runs_as_the_invoking_user() {
    // What sudo leaves in the environment.
    let dir = scratch("sudo");
    let out = dir.join("id");
    let cmd = vec![
        "sh".into(),
        "-c".into(),
        format!("id -u > {}; id -g >> {}", out.display(), out.display()),
    ];
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let _lock = bpf_lock(false);
    let st = std::process::Command::new(shmtrace())
        .args(["run", "--quiet", "--"])
        .args(&cmd)
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534")
        .status()
        .unwrap();
    assert!(st.success());
    let ids = std::fs::read_to_string(&out).unwrap();
    assert_eq!(ids.lines().next(), Some("65534"), "{ids}");
    // --user root keeps root.
    let st = std::process::Command::new(shmtrace())
        .args(["run", "--quiet", "--user", "root", "--"])
        .args(&cmd)
        .env("SUDO_UID", "65534")
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(
        std::fs::read_to_string(&out).unwrap().lines().next(),
        Some("0")
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn oom_kill_of_a_traced_process_holding_shmem() {
    let exe = workload("oom_shm");
    let cg = format!(
        "/sys/fs/cgroup/memory/shmtrace-test-oom-{}",
        std::process::id()
    );
    std::fs::create_dir_all(&cg).expect("memory cgroup (v1 memory controller)");
    std::fs::write(format!("{cg}/memory.limit_in_bytes"), "32M").unwrap();
    let t = run_traced(
        &[],
        &[
            "sh".into(),
            "-c".into(),
            format!("echo $$ > {cg}/cgroup.procs && exec {}", exe.display()),
        ],
    );
    let _ = std::fs::remove_dir(&cg);
    let pid = truth(&t.stdout())["pid"].as_u64().unwrap();
    let f = t.first();
    assert_eq!(f["kind"], "oom_kill", "{}", t.stderr());
    assert_eq!(f["pid"].as_u64(), Some(pid));
    // Most of the 32 MiB the cgroup allowed was the memfd's shmem.
    assert!(f["bytes"].as_u64().unwrap() > 16 << 20, "{f}");
    // The memory cgroup, read at the kill: its limit, use and shmem.
    let m = &f["memcg"];
    assert_eq!(m["version"], 1, "{f}");
    assert_eq!(m["limit_bytes"].as_u64(), Some(32 << 20), "{f}");
    assert!(
        m["path"]
            .as_str()
            .unwrap()
            .ends_with(&format!("shmtrace-test-oom-{}", std::process::id()))
    );
    assert!(m["shmem_bytes"].as_u64().unwrap() > 16 << 20, "{f}");
    assert!(
        f["cause"].as_str().unwrap().contains("allows 32.0 MiB"),
        "{f}"
    );
    let d = &t.report["diagnosis"];
    assert_eq!(d["signature"], "memcg:oom-kill");
    assert!(
        d["recommended_shm_bytes"].is_null(),
        "never a bigger /dev/shm: {d}"
    );
    assert!(
        d["fix"]
            .as_str()
            .unwrap()
            .contains("raise the memory limit"),
        "{d}"
    );
    assert_eq!(t.output.status.code(), Some(128 + 9));
}

#[test]
fn a_flood_of_self_sent_and_repeated_sigbus_cannot_hide_the_real_failure() {
    let exe = workload("sigbus_flood");
    // 200k SIGBUS sent to itself, 20k real faults recovered by a handler,
    // then the real ENOSPC of another process.
    let t = run_traced(
        &[],
        &private_shm(
            "size=8m",
            &format!("exec {} /dev/shm 200000 20000", exe.display()),
        ),
    );
    let truth = truth(&t.stdout());
    let (main, noise) = (truth["pid"].as_u64(), truth["noise"].as_u64());
    let f = t.first();
    assert_eq!(
        f["pid"].as_u64(),
        main,
        "the real failure is the first:\n{}",
        t.stderr()
    );
    assert_eq!(
        (f["kind"].as_str(), f["syscall"].as_str()),
        (Some("enospc"), Some("fallocate"))
    );
    assert_eq!(
        t.report["lost"]["failures_ring"].as_u64(),
        Some(0),
        "{}",
        t.report["lost"]
    );
    // Sent SIGBUS never take the failure ring: a few are reported, the
    // rest are counted against the process that got them.
    let held = &t.report["suppressed"];
    assert!(held["sent_sigbus"].as_u64().unwrap() > 150_000, "{held}");
    assert!(held["failure_records"].as_u64().unwrap() > 10_000, "{held}");
    let top = &held["by_process"][0];
    assert_eq!(top["pid"].as_u64(), noise, "{held}");
    // The faults past the end of the file: one entry with its count, not
    // thousands of entries.
    let others = t.report["other_sigbus"].as_array().unwrap();
    assert!(others.len() <= 4, "{others:?}");
    let past_end = others
        .iter()
        .find(|o| o["pid"].as_u64() == noise && o["si_code"] == 2)
        .unwrap_or_else(|| panic!("{others:?}"));
    assert!(past_end["count"].as_u64().unwrap() >= 1);
    assert!(
        past_end["reason"]
            .as_str()
            .unwrap()
            .contains("beyond the end"),
        "{past_end}"
    );
    // The noise process did not fail on shared memory.
    assert!(t.failures().iter().all(|f| f["pid"].as_u64() != noise));
    let size = serde_json::to_string(&t.report).unwrap().len();
    assert!(size < 1 << 20, "a report of {size} bytes");
    assert!(t.stderr().contains("held back"), "{}", t.stderr());
}

/// The limit on a parent cgroup (a pod's), none on the process's own: the
/// kill is diagnosed with the parent's limit, and the /dev/shm file that
/// filled it is named, with its bytes and that it keeps the charge.
#[test]
fn oom_kill_at_a_parents_limit_names_the_file_that_filled_it() {
    let pod = format!(
        "/sys/fs/cgroup/memory/shmtrace-test-pod-{}",
        std::process::id()
    );
    let ctr = format!("{pod}/ctr");
    std::fs::create_dir_all(&ctr).expect("memory cgroup (v1 memory controller)");
    std::fs::write(format!("{pod}/memory.limit_in_bytes"), "48M").unwrap();
    let t = run_traced(
        &[],
        &private_shm(
            "size=64m",
            &format!(
                "echo $$ > {ctr}/cgroup.procs && exec dd if=/dev/zero of=/dev/shm/big bs=1M count=60"
            ),
        ),
    );
    let _ = std::fs::remove_dir(&ctr);
    let _ = std::fs::remove_dir(&pod);
    let f = t.first();
    assert_eq!(f["kind"], "oom_kill", "{}", t.stderr());
    assert_eq!(f["comm"], "dd", "{f}");
    let m = &f["memcg"];
    assert_eq!(m["version"], 1, "{f}");
    assert_eq!(
        m["limit_bytes"].as_u64(),
        Some(48 << 20),
        "the parent's: {m}"
    );
    assert!(m["own_limit_bytes"].is_null(), "{m}");
    assert!(
        m["limit_path"]
            .as_str()
            .unwrap()
            .ends_with(&format!("shmtrace-test-pod-{}", std::process::id())),
        "{m}"
    );
    assert!(m["path"].as_str().unwrap().ends_with("/ctr"), "{m}");
    // The kernel's own OOM line names the parent as the cgroup that fired.
    let k = &f["kernel_oom"];
    assert_eq!(k["constraint"], "CONSTRAINT_MEMCG", "{f}");
    assert_eq!(k["oom_memcg"], m["limit_path"], "{f}");
    assert_eq!(k["pid"], f["pid"], "{f}");
    // The file that filled it is the failure's file.
    assert_eq!(f["path"], "/dev/shm/big", "{f}");
    assert_eq!(f["mount"]["mountpoint"], "/dev/shm", "{f}");
    let c = &f["charged_files"][0];
    assert_eq!(c["path"], "/dev/shm/big", "{f}");
    assert!(c["bytes"].as_u64().unwrap() > 40 << 20, "{c}");
    assert_eq!(
        c["outlives_victim"], true,
        "a named file keeps its charge: {c}"
    );
    let cause = f["cause"].as_str().unwrap();
    assert!(cause.contains("(above its own cgroup"), "{cause}");
    assert!(cause.contains("allows 48.0 MiB"), "{cause}");
    assert!(cause.contains("/dev/shm/big 4"), "{cause}");
    let fix = t.report["diagnosis"]["fix"].as_str().unwrap();
    assert!(fix.contains("cap /dev/shm below"), "{fix}");
    assert!(
        fix.contains("/dev/shm/big stays charged after the kill"),
        "{fix}"
    );
    let text = t.stderr();
    assert!(
        text.contains("/dev/shm/big"),
        "the summary names the file:\n{text}"
    );
}
