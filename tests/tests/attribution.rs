//! Who holds the bytes: per process, per file, per mount, per container,
//! checked against st_blocks and statfs as the workloads see them.
//! One file on purpose: its tests share the holders workload and the
//! helpers that read its output.

use std::{
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use shmtrace_tests::*;

const PAGE: i64 = 4096;

fn proc_of(r: &Value, pid: u64) -> &Value {
    r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("pid {pid} not in report"))
}

fn near(got: &Value, want: i64, files: i64, what: &str) {
    let got = got.as_i64().unwrap_or_else(|| panic!("{what}: {got}"));
    assert!(
        (got - want).abs() <= files * PAGE,
        "{what}: got {got}, want {want} (±{files} pages)"
    );
}

/// tests/workloads/holders.c in its own 32 MiB /dev/shm, untraced.
fn start_holders(exe: &Path, finish: &Path) -> Child {
    let script = format!(
        "mount -t tmpfs -o size=32m tmpfs /dev/shm && exec {} {}",
        exe.display(),
        finish.display()
    );
    let argv = in_private_ns(&script);
    Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// First JSON line a child prints on stdout.
fn first_json(child: &mut Child) -> Value {
    let out = child.stdout.as_mut().unwrap();
    let mut line = String::new();
    let mut r = BufReader::new(out);
    r.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|_| panic!("workload said: {line}"))
}

/// The job's private 32 MiB /dev/shm (the host's is listed too).
fn job_mount(r: &Value) -> &Value {
    r["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountpoint"] == "/dev/shm" && m["size_bytes"] == 32 << 20)
        .unwrap_or_else(|| panic!("no 32 MiB /dev/shm in {}", r["mounts"]))
}

fn check_holders(r: &Value, t: &Value, with_allocated: bool) {
    let (a1, a2, a3, named) = (
        t["a1"].as_i64().unwrap(),
        t["a2"].as_i64().unwrap(),
        t["a3"].as_i64().unwrap(),
        t["named"].as_i64().unwrap(),
    );
    let p1 = proc_of(r, t["p1"].as_u64().unwrap());
    let p2 = proc_of(r, t["p2"].as_u64().unwrap());
    let p3 = proc_of(r, t["p3"].as_u64().unwrap());
    near(
        &p1["held_bytes"],
        a1 + a2 + a3,
        3,
        "P1 holds its three unlinked files by fd",
    );
    near(
        &p2["held_bytes"],
        a2,
        1,
        "P2 holds the received file by its mapping",
    );
    near(&p3["held_bytes"], named, 1, "P3 holds the named file");
    let p4 = proc_of(r, t["p4"].as_u64().unwrap());
    near(
        &p4["held_bytes"],
        a3,
        1,
        "P4 holds the fd it received, unmapped",
    );
    if with_allocated {
        near(
            &p1["allocated_bytes"],
            a1 + a2 + a3,
            3,
            "P1 allocated its files' pages",
        );
        near(&p2["allocated_bytes"], 0, 0, "P2 allocated nothing");
        near(
            &p3["allocated_bytes"],
            named,
            1,
            "P3 allocated the named file",
        );
    }
    let m = job_mount(r);
    near(
        &m["used_bytes"],
        t["used"].as_i64().unwrap(),
        4,
        "mount used vs statfs",
    );
    near(
        &m["tracked_bytes"],
        a1 + a2 + a3 + named,
        4,
        "tracked files explain the use",
    );
    // The tree counts a2 once, though two processes hold it.
    let tree_max = r["trees"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["held_bytes"].as_i64().unwrap())
        .max()
        .unwrap_or(0);
    near(
        &Value::from(tree_max),
        a1 + a2 + a3 + named,
        4,
        "tree total without double counting",
    );
}

#[test]
fn three_holders_match_st_blocks_and_statfs_while_running_and_at_the_end() {
    let exe = workload("holders");
    let dir = scratch("holders");
    let (finish, report) = (dir.join("finish"), dir.join("r.json"));
    require_root();
    let _lock = bpf_lock(false);
    let _cleanup = Cleanup::new(Some(finish.clone()));
    let mut job = Command::new(shmtrace())
        .args(["run", "--quiet", "--report"])
        .arg(&report)
        .arg("--")
        .args(private_shm(
            "size=32m",
            &format!("exec {} {}", exe.display(), finish.display()),
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let truth = first_json(&mut job);
    let r = report_until(&report, "P1's files", |r| {
        r["processes"].as_array().is_some_and(|ps| {
            ["p2", "p4"].iter().all(|k| {
                ps.iter()
                    .any(|p| p["pid"] == truth[*k] && p["held_bytes"].as_i64() > Some(0))
            }) && ps.iter().any(|p| {
                p["pid"] == truth["p1"] && p["held_bytes"].as_i64() > Some((6 << 20) - 4 * PAGE)
            })
        })
    });
    assert_eq!(r["mode"], "running");
    check_holders(&r, &truth, true);
    std::fs::write(&finish, "").unwrap();
    assert!(job.wait().unwrap().success());
    // At the end: everything was released; the peaks kept what was held.
    let r: Value = read_report(&report);
    let p1 = proc_of(&r, truth["p1"].as_u64().unwrap());
    near(
        &p1["peak_held_bytes"],
        truth["a1"].as_i64().unwrap()
            + truth["a2"].as_i64().unwrap()
            + truth["a3"].as_i64().unwrap(),
        3,
        "P1 peak",
    );
    near(
        &p1["peak_allocated_bytes"],
        truth["a1"].as_i64().unwrap()
            + truth["a2"].as_i64().unwrap()
            + truth["a3"].as_i64().unwrap(),
        3,
        "P1 allocated peak",
    );
    let m = job_mount(&r);
    near(
        &m["peak_used_bytes"],
        truth["used"].as_i64().unwrap(),
        4,
        "mount peak",
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn pid_on_a_job_that_already_holds_shm_reports_it_at_once() {
    let exe = workload("holders");
    let dir = scratch("attach-held");
    let (finish, report) = (dir.join("finish"), dir.join("r.json"));
    require_root();
    let _lock = bpf_lock(false);
    let mut cleanup = Cleanup::new(Some(finish.clone()));
    let mut job = start_holders(&exe, &finish);
    let truth = first_json(&mut job);
    let main = job.id();
    let mut tracer = Command::new(shmtrace())
        .args(["--pid", &main.to_string(), "--quiet", "--report"])
        .arg(&report)
        .spawn()
        .unwrap();
    cleanup.pids.push(tracer.id());
    let r = report_until(&report, "the held bytes", |r| {
        r["processes"].as_array().is_some_and(|ps| {
            ["p1", "p2", "p3", "p4"].iter().all(|k| {
                ps.iter()
                    .any(|p| p["pid"] == truth[*k] && p["held_bytes"].as_i64() > Some(0))
            })
        })
    });
    check_holders(&r, &truth, false);
    std::fs::write(&finish, "").unwrap();
    job.wait().unwrap();
    assert!(tracer.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(dir);
}

/// GET http://127.0.0.1:PORT/PATH, body only.
struct Pod {
    cgroup: PathBuf,
    uid: &'static str,
    id: &'static str,
}

fn make_pod(path: String, uid: &'static str, id: &'static str) -> Pod {
    let cgroup = PathBuf::from("/sys/fs/cgroup/unified").join(path.trim_start_matches('/'));
    std::fs::create_dir_all(&cgroup).expect("cgroup v2 directory");
    Pod { cgroup, uid, id }
}

impl Drop for Pod {
    fn drop(&mut self) {
        // Remove the leaf and its empty parents up to the hierarchy root.
        let mut p = self.cgroup.clone();
        while p != Path::new("/sys/fs/cgroup/unified") && std::fs::remove_dir(&p).is_ok() {
            p.pop();
        }
    }
}

fn start_in(pod: &Pod, shm: &str, mib: u32, finish: &Path) -> (Child, Value) {
    let exe = workload("hold");
    let mut c = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs && exec unshare -m --propagation private sh -c \
             'mount -t tmpfs -o size={shm} tmpfs /dev/shm && exec {} /dev/shm/data {mib} {}'",
            pod.cgroup.display(),
            exe.display(),
            finish.display()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let t = first_json(&mut c);
    (c, t)
}

fn container<'a>(r: &'a Value, pod: &Pod) -> Option<&'a Value> {
    r["containers"]
        .as_array()?
        .iter()
        .find(|c| c["pod_uid"] == pod.uid)
}

#[test]
fn node_wide_attributes_each_pod_its_bytes_and_mount() {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("pods");
    let (finish, report) = (dir.join("finish"), dir.join("r.json"));
    let a = make_pod(
        format!(
            "/kubepods/burstable/pod{}/{}",
            "0a6f5a3e-1111-4c3b-9a4e-3c2b1a0f9e8d",
            "a".repeat(64)
        ),
        "0a6f5a3e-1111-4c3b-9a4e-3c2b1a0f9e8d",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    );
    let b = make_pod(
        format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{}.scope",
            "7b1e2d3c-2222-4f5a-8b6c-9d0e1f2a3b4c".replace('-', "_"),
            "b".repeat(64)
        ),
        "7b1e2d3c-2222-4f5a-8b6c-9d0e1f2a3b4c",
        "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
    );
    // The kubelet's log links name pod A's container (B has none).
    let kubelet = Path::new("/var/log/containers");
    std::fs::create_dir_all(kubelet).unwrap();
    let link = kubelet.join(format!("trainer-0_ml-team_loader-{}.log", a.id));
    let _ = std::os::unix::fs::symlink("/dev/null", &link);
    let port = 19000 + std::process::id() % 1000;
    let mut cleanup = Cleanup::new(Some(finish.clone()));
    let mut tracer = start_node_wide(&["--metrics", &format!("127.0.0.1:{port}")], &report);
    cleanup.pids.push(tracer.id());

    let (mut ja, ta) = start_in(&a, "16m", 6, &finish);
    let r = report_until(&report, "pod A's bytes", |r| {
        container(r, &a).is_some_and(|c| c["held_bytes"].as_i64() > Some(0))
    });
    let ca = container(&r, &a).unwrap();
    near(
        &ca["held_bytes"],
        ta["blocks"].as_i64().unwrap(),
        1,
        "pod A holds its file",
    );
    assert_eq!(ca["container_id"], a.id);
    assert_eq!(ca["runtime"], "containerd");

    let (mut jb, tb) = start_in(&b, "32m", 10, &finish);
    let r = report_until(&report, "pod B's bytes", |r| {
        container(r, &b).is_some_and(|c| c["held_bytes"].as_i64() > Some(0))
    });
    let (ca, cb) = (container(&r, &a).unwrap(), container(&r, &b).unwrap());
    near(
        &cb["held_bytes"],
        tb["blocks"].as_i64().unwrap(),
        1,
        "pod B holds its file",
    );
    near(
        &ca["held_bytes"],
        ta["blocks"].as_i64().unwrap(),
        1,
        "filling B did not move A",
    );
    assert_eq!(cb["container_id"], b.id);
    // Each pod's /dev/shm is its own mount, with its own size.
    let mounts = r["mounts"].as_array().unwrap();
    let sizes: Vec<i64> = mounts
        .iter()
        .filter(|m| m["mountpoint"] == "/dev/shm")
        .filter_map(|m| m["size_bytes"].as_i64())
        .collect();

    // The same numbers as Prometheus metrics, with names from the kubelet.
    let metrics = http_get(port, "/metrics");
    let held = |sel: &str| -> i64 {
        metrics
            .lines()
            .find(|l| l.starts_with("shmtrace_container_shm_held_bytes{") && l.contains(sel))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no held bytes for {sel}:\n{metrics}"))
    };
    near(
        &Value::from(held(
            r#"namespace="ml-team",pod="trainer-0",container="loader""#,
        )),
        ta["blocks"].as_i64().unwrap(),
        1,
        "metric, pod A by name",
    );
    near(
        &Value::from(held(&format!("pod=\"{}\"", b.uid))),
        tb["blocks"].as_i64().unwrap(),
        1,
        "metric, pod B by UID",
    );
    assert!(
        metrics.contains("shmtrace_tmpfs_size_bytes{mountpoint=\"/dev/shm\""),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("shmtrace_tmpfs_size_bytes")
                && l.contains("trainer-0")
                && l.ends_with(" 16777216")),
        "{metrics}"
    );
    assert!(
        metrics.contains("shmtrace_events_lost_total{stage=\"events_ring\"} 0"),
        "{metrics}"
    );
    assert!(!metrics.contains("pid="), "no pid labels");
    assert_eq!(http_get(port, "/healthz").trim(), "ok");
    let _ = std::fs::remove_file(&link);
    assert!(
        sizes.contains(&(16 << 20)) && sizes.contains(&(32 << 20)),
        "{mounts:?}"
    );

    std::fs::write(&finish, "").unwrap();
    ja.wait().unwrap();
    jb.wait().unwrap();
    // SAFETY: plain kill(2).
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    let mut rest = String::new();
    let _ = tracer.stderr.as_mut().unwrap().read_to_string(&mut rest);
    assert!(tracer.wait().unwrap().success(), "{rest}");
    drop((a, b));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn live_view_on_a_terminal_and_plain_lines_in_a_pipe() {
    require_root();
    let _lock = bpf_lock(false);
    let exe = workload("holders");
    let dir = scratch("live");
    let finish = dir.join("finish");
    let mut cleanup = Cleanup::new(Some(finish.clone()));
    let mut job = start_holders(&exe, &finish);
    let _truth = first_json(&mut job);
    let pid = job.id();

    // A real terminal: tmux.
    let session = format!("shmtrace-test-{}", std::process::id());
    let st = Command::new("tmux")
        .args(["new-session", "-d", "-x", "160", "-y", "45", "-s", &session])
        .arg(format!("{} --pid {pid}", shmtrace().display()))
        .status()
        .unwrap();
    assert!(st.success());
    let start = Instant::now();
    let screen = loop {
        let out = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &session])
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        if s.contains("TMPFS MOUNTS") && s.contains("[#") {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no live screen:\n{s}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = Command::new("tmux")
        .args(["kill-session", "-t", &session])
        .status();
    assert!(
        screen.contains("/dev/shm") && screen.contains("PROCESSES") && screen.contains("holders"),
        "{screen}"
    );
    assert!(screen.contains("10.0 MiB"), "the mount's use:\n{screen}");

    // Piped: plain lines, no escape codes.
    let mut tracer = Command::new(shmtrace())
        .args(["--pid", &pid.to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    cleanup.pids.push(tracer.id());
    let err = Captured::stderr(&mut tracer);
    // The once-a-second line, once it has the job's mount.
    err.until("a status line with the mount", |l| {
        l.starts_with("shmtrace +")
            && l.contains("/dev/shm of mount ns ")
            && l.contains(" 10.0 MiB/32.0 MiB")
    });
    std::fs::write(&finish, "").unwrap();
    job.wait().unwrap();
    assert!(tracer.wait().unwrap().success());
    let err = err.all();
    assert!(!err.contains('\x1b'), "escape codes in a pipe: {err:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// shmtrace's anchor processes (one per watched mount namespace) in
/// mount namespace `ns` (a /proc/PID/ns/mnt link).
fn anchors_in(tracer: u32, ns: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path().join("ns/mnt")).is_ok_and(|l| l.to_string_lossy() == ns)
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|s| {
            let after = s.rsplit(')').next().unwrap_or("");
            s.contains("(shmtrace-anchor)")
                && after.split_whitespace().nth(1) == Some(&tracer.to_string())
        })
        .count()
}

#[test]
fn node_wide_lets_go_of_a_finished_containers_namespace() {
    require_root();
    // Alone: a node-wide tracer anchors other tests' namespaces too.
    let _lock = bpf_lock(true);
    let dir = scratch("ns-release");
    let (finish, report) = (dir.join("finish"), dir.join("r.json"));
    let mut cleanup = Cleanup::new(Some(finish.clone()));
    let mut tracer = start_node_wide(&["--ns-grace", "1"], &report);
    cleanup.pids.push(tracer.id());

    let exe = workload("hold");
    let argv = in_private_ns(&format!(
        "mount -t tmpfs -o size=24m tmpfs /dev/shm && exec {} /dev/shm/data 3 {}",
        exe.display(),
        finish.display()
    ));
    let mut job = Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let _truth = first_json(&mut job);
    let ns = std::fs::read_link(format!("/proc/{}/ns/mnt", job.id()))
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let has_mount = |r: &Value| {
        r["mounts"]
            .as_array()
            .is_some_and(|ms| ms.iter().any(|m| m["size_bytes"] == 24 << 20))
    };
    report_until(&report, "the job's 24 MiB /dev/shm", has_mount);
    assert_eq!(
        anchors_in(tracer.id(), &ns),
        1,
        "its namespace is anchored while it runs"
    );

    std::fs::write(&finish, "").unwrap();
    job.wait().unwrap();
    // After the grace period the namespace is let go: no anchor, no mount.
    report_until(&report, "the mount gone", |r| !has_mount(r));
    let start = Instant::now();
    while anchors_in(tracer.id(), &ns) > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "anchor still there"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: plain kill(2).
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    assert!(tracer.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn node_wide_a_short_lived_tmpfs_writer_is_named_by_its_command_line() {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("short-writer");
    let report = dir.join("r.json");
    let mut cleanup = Cleanup::new(None);
    let mut tracer = start_node_wide(&[], &report);
    cleanup.pids.push(tracer.id());
    // Node-wide, a process's tmpfs events after its first do not wake the
    // agent (it drains them every 200 ms): the first must, so that what
    // can only be read while it lives (its arguments) is read. This one
    // creates a file, fills 1 MiB of it and is gone 100 ms later.
    let script = dir.join("short.sh");
    std::fs::write(
        &script,
        "echo \"{\\\"pid\\\":$$}\"\n\
         exec 3>/dev/shm/short\n\
         head -c 1048576 /dev/zero >&3\n\
         sleep 0.1\n",
    )
    .unwrap();
    let marker = format!("marker-{}", std::process::id());
    let argv = private_shm("size=8m", &format!("exec sh {} {marker}", script.display()));
    let out = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let pid = truth(&String::from_utf8_lossy(&out.stdout))["pid"]
        .as_u64()
        .unwrap();
    let r = report_until(&report, "the writer with its arguments", |r| {
        r["processes"].as_array().is_some_and(|ps| {
            ps.iter().any(|p| {
                p["pid"].as_u64() == Some(pid)
                    && p["cmdline"].as_str().is_some_and(|c| c.contains(&marker))
            })
        })
    });
    let p = proc_of(&r, pid);
    assert_eq!(p["comm"], "sh", "{p}");
    // SAFETY: plain kill(2).
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    assert!(tracer.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(dir);
}

/// The pane as tmux shows it, wrapped lines joined (a line wider than the
/// pane would show as one longer line).
fn pane(session: &str) -> Vec<String> {
    let out = Command::new("tmux")
        .args(["capture-pane", "-p", "-J", "-t", session])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines: Vec<String> = text.lines().map(|l| l.trim_end().to_string()).collect();
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
}

/// Every line within `w` columns, at most `h` of them, title and totals on
/// top: what an operator in an 80x24 terminal must see.
fn fits(lines: &[String], w: usize, h: usize) {
    let screen = lines.join("\n");
    assert!(lines.len() <= h, "{} lines in {h}:\n{screen}", lines.len());
    for l in lines {
        assert!(l.chars().count() <= w, "wider than {w}: {l:?}\n{screen}");
    }
    assert!(lines[0].starts_with("shmtrace  +"), "title:\n{screen}");
    assert!(lines[1].starts_with("tmpfs "), "totals:\n{screen}");
    assert!(
        lines[2].starts_with("TMPFS MOUNTS ("),
        "mounts first:\n{screen}"
    );
}

#[test]
fn live_view_fits_80x24_with_several_mounts_and_holders() {
    require_root();
    let _lock = bpf_lock(false);
    let exe = workload("holders");
    let dir = scratch("live-fit");
    let finish = dir.join("finish");
    let mut cleanup = Cleanup::new(Some(finish.clone()));
    let session = format!("shmtrace-fit-{}", std::process::id());
    let st = Command::new("tmux")
        .args(["new-session", "-d", "-x", "80", "-y", "24", "-s", &session])
        .arg(shmtrace().display().to_string())
        .status()
        .unwrap();
    assert!(st.success());
    struct Kill(String);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = Command::new("tmux")
                .args(["kill-session", "-t", &self.0])
                .status();
        }
    }
    let _kill = Kill(session.clone());
    let start = Instant::now();
    while !pane(&session).iter().any(|l| l.starts_with("TMPFS MOUNTS")) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no live screen:\n{}",
            pane(&session).join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Three private /dev/shm with their holders (five processes each),
    // and a fourth that dd fills to ENOSPC.
    let mut jobs: Vec<Child> = (0..3).map(|_| start_holders(&exe, &finish)).collect();
    let mut holders = Vec::new();
    for j in &mut jobs {
        let truth = first_json(j);
        holders.extend(["p1", "p2", "p3", "p4"].map(|k| truth[k].as_u64().unwrap()));
        cleanup.pids.push(j.id());
    }
    let dd = in_private_ns(
        "mount -t tmpfs -o size=4m tmpfs /dev/shm && exec dd if=/dev/zero of=/dev/shm/fill bs=1M count=8",
    );
    let fill = Command::new(&dd[0])
        .args(&dd[1..])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!fill.success(), "dd ran out of space");

    // The view once it shows our failing mount and the failure.
    let start = Instant::now();
    let screen = loop {
        let lines = pane(&session);
        let text = lines.join("\n");
        let mounts = lines.iter().filter(|l| l.contains(" /dev/shm ")).count();
        if lines.iter().any(|l| l.starts_with("! /dev/shm")) && text.contains("(dd)") && mounts >= 4
        {
            break lines;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never showed 4 mounts, the failing one marked, and the dd failure:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    fits(&screen, 80, 24);
    let text = screen.join("\n");
    // The failure row names its mount and where it is (a private mount
    // namespace here, no container).
    assert!(
        screen
            .iter()
            .any(|l| l.contains("enospc write  pid ") && l.contains("(dd)  /dev/shm of mount ns ")),
        "{text}"
    );
    // Mount rows name their owner, never a bare device.
    for l in screen
        .iter()
        .filter(|l| l.contains(" /dev/shm ") && l.contains('%'))
    {
        assert!(
            l.contains("mount ns ")
                || l.contains("host")
                || l.contains("pod ")
                || l.contains("podman ")
                || l.contains("docker "),
            "a mount row without its owner: {l}\n{text}"
        );
    }
    assert_eq!(holders.len(), 12, "{holders:?}");

    // Bigger: the same, and room for the processes.
    let _ = Command::new("tmux")
        .args(["resize-window", "-t", &session, "-x", "120", "-y", "30"])
        .status();
    std::thread::sleep(Duration::from_millis(1500));
    let big = pane(&session);
    fits(&big, 120, 30);
    assert!(
        big.iter().any(|l| l.starts_with("PROCESSES")),
        "{}",
        big.join("\n")
    );

    std::fs::write(&finish, "").unwrap();
    for mut j in jobs {
        j.wait().unwrap();
    }
    let _ = std::fs::remove_dir_all(dir);
}
