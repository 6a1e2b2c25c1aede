//! The kernels GPU fleets boot, each a cgroup-v2-only node: Debian 11's
//! 5.10 (Amazon Linux 2's generation), Debian 12's 6.1 and 6.12 (the
//! current LTS), booted under QEMU (TCG: KVM does not work on these VMs)
//! with an initramfs of static busybox, this shmtrace binary and its
//! libraries, and the static C workloads. Its /init (tests/vm/init.sh)
//! mounts only cgroup2, makes Kubernetes' systemd-driver cgroup shape, runs
//! the scenarios that matter on such nodes and writes their reports to a
//! second serial port, which these tests check: doctor (every hook
//! attached), the first failing worker (SIGBUS, write and fallocate
//! ENOSPC), ENOSPC on open at the inode limit, mmap ENOMEM under RLIMIT_AS,
//! an OOM kill at a pod slice's memory.max with the file that filled it,
//! and a node-wide incident named by its pod from a PID namespace.
//!
//! scripts/setup.sh --test fetches the kernel packages into
//! /var/cache/shmtrace/vm (never installed) and QEMU and busybox from
//! Debian.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::Value;
use shmtrace_tests::*;

const POD_UID: &str = "1a2b3c4d-5e6f-4a8b-9c0d-00000000cafe";
const POD2_UID: &str = "1a2b3c4d-5e6f-4a8b-9c0d-00000000beef";
const CTR_ID: &str = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00";

/// The initramfs: busybox, shmtrace with its libraries, the workloads and
/// /init, as a gzipped newc cpio.
fn initramfs(dir: &Path) -> PathBuf {
    let root = guest::Initramfs::new(dir).unwrap();
    root.put_dynamic(&shmtrace(), "/bin/shmtrace").unwrap();
    for w in ["order", "inodes", "mmap_error"] {
        let src = root_dir().join("tests/workloads").join(format!("{w}.c"));
        let exe = guest::static_build(&src, &dir.join(w)).unwrap();
        root.put(&exe, &format!("/work/{w}")).unwrap();
    }
    root.put(&root_dir().join("tests/vm/init.sh"), "/init")
        .unwrap();
    root.pack(&dir.join("initrd.gz")).unwrap()
}

/// One VM's run: the data port's sections and what it booted.
struct Vm {
    hooks: String,
    s: BTreeMap<(String, String), String>,
    text: String,
    console: String,
    kernel_line: String,
    elapsed: Duration,
}

/// SHMTRACE_VM_ONLY=NAME boots each VM for one scenario (doctor, order,
/// inodes, mmap-error, oom-pod, node-pod): for work on one of them; the
/// other checks are then skipped and nothing is recorded as tested.
fn only() -> Option<String> {
    std::env::var("SHMTRACE_VM_ONLY")
        .ok()
        .filter(|o| !o.is_empty())
}

/// Boots Debian's kernel SERIES with `shmtrace.hooks=HOOKS` and waits for
/// its scenarios. A guest that crashed before its /init ran (TCG's
/// emulation of the kernel patching its own code at boot, on SMP, oopses
/// now and then: "Oops: int3" in the console, nothing of ours yet run) is
/// booted once more.
fn boot(series: &str, hooks: &str) -> Vm {
    for attempt in 1.. {
        match boot_once(series, hooks) {
            Ok(vm) => return vm,
            Err(console) if attempt < 2 => {
                let tail: Vec<&str> = console.lines().rev().take(20).collect();
                eprintln!(
                    "vm: the {series} guest crashed before /init (attempt {attempt}), booting again; console ends:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            Err(console) => panic!("the {series} guest crashed before /init twice:\n{console}"),
        }
    }
    unreachable!()
}

/// One boot: Err(console) when the guest never reached /init.
fn boot_once(series: &str, hooks: &str) -> Result<Vm, String> {
    let dir = scratch(&format!("vm-{series}-{hooks}"));
    let kernel = guest::kernel(series).unwrap();
    let initrd = initramfs(&dir);
    let append = format!(
        "shmtrace.hooks={hooks}{}",
        only()
            .map(|o| format!(" shmtrace.only={o}"))
            .unwrap_or_default()
    );
    // TCG: about 10 s to /init and 12 s per shmtrace run alone; VMs booted
    // side by side share the machine's 2 cores.
    let limit = Duration::from_secs(900);
    let booted = guest::boot(&kernel, &initrd, &append, &dir, limit)
        .unwrap_or_else(|e| panic!("the {series} VM: {e:#}"));
    let (text, console) = (booted.data, booted.console);
    if text.trim().is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(console);
    }
    let s = guest::sections(&text);
    let kernel_line = s
        .keys()
        .find(|(n, _)| n == "kernel")
        .map(|(_, f)| f.clone())
        .unwrap_or_default();
    // The kernel it tested, in the suite's log.
    eprintln!(
        "vm: kernel {kernel_line} ({}), hooks {hooks}: booted and checked in {:.0?}",
        kernel.display(),
        booted.elapsed
    );
    assert!(
        kernel_line.starts_with(&format!("{series}.")),
        "not the {series} kernel: {kernel_line:?}\n{console}"
    );
    assert!(
        s.contains_key(&("done".into(), String::new())),
        "the {series} VM did not finish its scenarios:\n{text}\nconsole:\n{console}"
    );
    // SHMTRACE_VM_KEEP=1 keeps the serial logs, for work on a scenario.
    if std::env::var_os("SHMTRACE_VM_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("vm: logs kept in {}", dir.display());
    }
    Ok(Vm {
        hooks: hooks.to_string(),
        s,
        text,
        console,
        kernel_line,
        elapsed: booted.elapsed,
    })
}

#[test]
fn debian_5_10() {
    kernel_matrix("5.10");
}

#[test]
fn debian_6_1() {
    kernel_matrix("6.1");
}

#[test]
fn debian_6_12() {
    kernel_matrix("6.12");
}

/// The scenarios whose reports both backends must agree on.
const SCENARIOS: &[&str] = &[
    "order-sigbus",
    "order-write",
    "order-fallocate",
    "inodes",
    "mmap-error",
    "oom-pod",
    "node-pod",
];

fn kernel_matrix(series: &str) {
    require_root();
    let tested = root_dir().join(format!("target/vm-tested-{series}.txt"));
    let _ = std::fs::remove_file(&tested);
    // One boot per backend: each starts from the same fresh machine (the
    // pods' cgroups, their OOM counts), as two nodes would.
    let tp = boot(series, "tracepoints");
    check(&tp);
    let vm = boot(series, "auto");
    let reports = check(&vm);
    let agreed = same_story(&tp, &vm);
    if only().is_some() {
        return;
    }
    let _ = std::fs::write(
        &tested,
        format!(
            "vm: Debian's kernel {} under QEMU, cgroup v2 only with Kubernetes' systemd-driver slices, \
             with syscall tracepoints and with trampolines: {}; the two agree on {agreed} reports: \
             passed in {:.0?}\n",
            vm.kernel_line,
            reports.join(", "),
            vm.elapsed
        ),
    );
}

/// Each scenario's report from VM A is the one from VM B (two backends):
/// the same first failure, failures, files and diagnosis ([`story`]).
/// Returns how many were compared.
fn same_story(va: &Vm, vb: &Vm) -> usize {
    let (a, b) = (&va.hooks, &vb.hooks);
    let mut n = 0;
    for name in SCENARIOS {
        let get = |vm: &Vm| {
            vm.s.get(&(name.to_string(), "report.json".to_string()))
                .filter(|r| !r.trim().is_empty())
                .map(|r| story(&report_json(r)))
        };
        let (Some(x), Some(y)) = (get(va), get(vb)) else {
            assert!(only().is_some(), "{name}: a report is missing\n{}", vb.text);
            continue;
        };
        assert_eq!(
            x, y,
            "{name} on {}: --hooks {a} and --hooks {b} tell different stories",
            vb.kernel_line
        );
        n += 1;
    }
    n
}

/// Checks every scenario of one VM; returns what was checked.
fn check(vm: &Vm) -> Vec<&'static str> {
    let (s, text, console_text) = (&vm.s, &vm.text, &vm.console);
    let mut checked = Vec::new();
    let on = |n: &str| only().is_none_or(|o| o == n);
    // Only cgroup2 is mounted (cgroup_no_v1=all), with the memory controller.
    let layout = &s[&("layout".into(), "fs.txt".into())];
    let mounts: Vec<&str> = layout.lines().filter(|l| l.contains("cgroup")).collect();
    assert_eq!(mounts.len(), 1, "{layout}");
    assert!(
        mounts[0].starts_with("cgroup2 /sys/fs/cgroup cgroup2 "),
        "{layout}"
    );
    assert!(
        layout.lines().any(|l| l.split(' ').any(|c| c == "memory")),
        "{layout}"
    );

    let backend = &vm.hooks;
    let report = |name: &str| -> Value {
        let r = s
            .get(&(name.to_string(), "report.json".to_string()))
            .unwrap_or_else(|| panic!("no report for {name} with {backend}:\n{text}"));
        let stderr = s
            .get(&(name.to_string(), "stderr.txt".to_string()))
            .cloned()
            .unwrap_or_default();
        assert!(
            !r.trim().is_empty(),
            "{name} with {backend}: empty report; shmtrace said:\n{stderr}\nconsole:\n{console_text}"
        );
        report_json(r)
    };

    if on("doctor") {
        // 0: doctor attached every hook.
        let doctor = &s[&("doctor".into(), "doctor.txt".into())];
        assert!(
            doctor.contains("\nexit 0"),
            "doctor failed:\n{doctor}\n{}",
            s[&("doctor".into(), "stderr.txt".into())]
        );
        let hook_lines: Vec<&str> = doctor
            .lines()
            .filter(|l| {
                let l = l.trim_start();
                l.starts_with("tracepoint ") || l.starts_with("raw_tp/") || l.starts_with("fexit/")
            })
            .collect();
        assert!(hook_lines.len() >= 14, "{doctor}");
        for l in &hook_lines {
            assert!(
                l.trim_end().ends_with(" ok") || l.contains("no such syscall tracepoint"),
                "a hook was refused on {}: {l}\n{doctor}",
                vm.kernel_line
            );
        }
        // Where trampolines are asked for, a syscall tracepoint is attached
        // only for a need that fell back, and doctor says why.
        let syscall_tps = hook_lines
            .iter()
            .filter(|l| l.contains("tracepoint syscalls:"))
            .count();
        if backend != "tracepoints" {
            // These kernels have BPF trampolines: every need is on one, so
            // work that never touches tmpfs pays nothing.
            let on = doctor
                .lines()
                .filter(|l| l.contains(" trampolines (fexit/"))
                .count();
            let needs = shmtrace::capture::hooks::TRAMPOLINES;
            let carried = needs.iter().filter(|t| !t.functions.is_empty()).count();
            assert!(
                on == carried && syscall_tps == 0 && !doctor.contains("fell back:"),
                "{}: not every need on a trampoline:\n{doctor}",
                vm.kernel_line
            );
            // What no tmpfs code sees is named, not silently dropped.
            let blind = doctor.lines().filter(|l| l.contains("not seen: ")).count();
            assert_eq!(blind, needs.len() - carried, "{doctor}");
        } else {
            assert!(syscall_tps >= 10 && !doctor.contains("fexit/"), "{doctor}");
        }
        checked.push("doctor (every hook attached)");
    }

    if on("order") {
        // 1, 2: the first failing worker, in the order the workload released them.
        for mode in ["sigbus", "write", "fallocate"] {
            let name = format!("order-{mode}");
            let r = report(&name);
            let truth = truth(&s[&(name.clone(), "truth.json".into())]);
            let order = pids(&truth["order"]);
            let first = &r["first_failure"];
            assert_eq!(first["pid"].as_u64(), Some(order[0]), "{name}: {first}");
            assert_eq!(first["path"], "/dev/shm/w2", "{name}: {first}");
            let kind = if mode == "sigbus" { "sigbus" } else { "enospc" };
            assert_eq!(first["kind"], kind, "{name}: {first}");
            let mut seen = Vec::new();
            for f in r["failures"].as_array().unwrap() {
                let pid = f["pid"].as_u64().unwrap();
                if !seen.contains(&pid) {
                    seen.push(pid);
                }
            }
            assert_eq!(seen, order, "{name}: failures in the order released");
            // The parent's ballast (all but half a segment of the mount)
            // held it when the first worker failed.
            let workers = pids(&truth["pids"]);
            let ballast = first["holders"].as_array().unwrap().iter().any(|h| {
                h["held_bytes"].as_u64() >= Some(5 << 20)
                    && !workers.contains(&h["pid"].as_u64().unwrap())
            });
            assert!(ballast, "{name}: the parent's ballast is a holder: {first}");
            if mode != "sigbus" {
                assert_eq!(first["syscall"], mode, "{name}: {first}");
            }
        }
        checked.push(
            "first failing worker exact, collateral in order (SIGBUS, write and fallocate ENOSPC)",
        );
    }

    if on("inodes") {
        // ENOSPC on open at the inode limit.
        let r = report("inodes");
        let t = truth(&s[&("inodes".into(), "truth.json".into())]);
        assert_eq!(t["errno"].as_i64(), Some(28), "{t}");
        let f = &r["first_failure"];
        assert_eq!(f["kind"], "enospc", "{f}");
        assert_eq!(f["syscall"], "openat", "{f}");
        assert_eq!(f["path"].as_str(), t["path"].as_str(), "{f}");
        assert_eq!(f["pid"].as_u64(), t["pid"].as_u64(), "{f}");
        assert!(f["cause"].as_str().unwrap().contains("inode limit"), "{f}");
        checked.push("open ENOSPC at the inode limit");
    }

    if on("mmap-error") {
        // mmap ENOMEM under RLIMIT_AS.
        let r = report("mmap-error");
        let t = truth(&s[&("mmap-error".into(), "truth.json".into())]);
        let f = &r["first_failure"];
        assert_eq!(f["kind"], "mmap_error", "{f}");
        assert_eq!(f["syscall"], "mmap", "{f}");
        assert_eq!(f["errno"].as_i64(), Some(12), "{f}");
        assert_eq!(f["errno"].as_i64(), t["errno"].as_i64(), "{f}");
        assert_eq!(f["bytes"].as_u64(), Some(1 << 30), "{f}");
        assert_eq!(f["path"].as_str(), Some("/dev/shm/big"), "{f}");
        checked.push("mmap ENOMEM under RLIMIT_AS");
    }

    if on("oom-pod") {
        // 3: the OOM kill at the pod slice's limit, with the file that filled it.
        let r = report("oom-pod");
        let f = &r["first_failure"];
        assert_eq!(f["kind"], "oom_kill", "{f}");
        let m = &f["memcg"];
        assert_eq!(m["version"], 2, "{m}");
        assert_eq!(m["limit_bytes"].as_u64(), Some(48 << 20), "{m}");
        assert!(m["own_limit_bytes"].is_null(), "{m}");
        let pod_slice = format!("kubepods-burstable-pod{}.slice", POD_UID.replace('-', "_"));
        assert!(
            m["limit_path"].as_str().unwrap().ends_with(&pod_slice),
            "the pod's slice holds the limit: {m}"
        );
        assert!(m["oom_kills"].as_u64() >= Some(1), "memory.events: {m}");
        assert_eq!(f["kernel_oom"]["oom_memcg"], m["limit_path"], "{f}");
        assert_eq!(f["path"], "/dev/shm/big", "{f}");
        let c = &f["charged_files"][0];
        assert_eq!(c["path"], "/dev/shm/big", "{f}");
        assert!(c["bytes"].as_u64().unwrap() > 40 << 20, "{c}");
        assert_eq!(c["outlives_victim"], true, "{c}");
        let ctr = &f["container"];
        assert_eq!(ctr["pod_uid"], POD_UID, "{ctr}");
        assert_eq!(ctr["container_id"], CTR_ID, "{ctr}");
        let fix = r["diagnosis"]["fix"].as_str().unwrap();
        assert!(
            fix.contains("raise the pod's memory limit (48.0 MiB on"),
            "{fix}"
        );
        assert!(fix.contains("cap /dev/shm below"), "{fix}");
        assert!(fix.contains("/dev/shm/big stays charged"), "{fix}");
        checked.push("OOM kill at a pod slice's memory.max with the file that filled it");
    }

    if on("node-pod") {
        // 4: node-wide, the pod's incident from a PID namespace.
        let r = report("node-pod");
        let ours: Vec<&Value> = r["incidents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["container"]["pod_uid"] == POD2_UID)
            .collect();
        assert_eq!(ours.len(), 1, "{}", r["incidents"]);
        let f = &ours[0]["first_failure"];
        assert_eq!(f["kind"], "enospc", "{f}");
        assert_eq!(f["path"], "/dev/shm/batch", "{f}");
        assert_eq!(f["mount"]["mountpoint"], "/dev/shm", "{f}");
        assert_eq!(f["mount"]["size_bytes"].as_u64(), Some(4 << 20), "{f}");
        let ns_pid = f["ns_pid"]
            .as_u64()
            .expect("the pid it sees in its namespace");
        assert!(ns_pid < 10 && ns_pid != f["pid"].as_u64().unwrap(), "{f}");
        checked.push("node-wide incident named by its pod from a PID namespace");
    }
    checked
}
