//! `shmtrace --pid`: attach to a running process and follow its future
//! children.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use shmtrace_tests::*;

fn wait_for_file(path: &std::path::Path) -> String {
    let start = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return s.trim().to_string();
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn pid_catches_a_failure_in_a_child_forked_after_attach() {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("attach");
    let pidfile = dir.join("pid");
    let report = dir.join("report.json");
    let exe = workload("late_child");
    let job = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs -o size=4m tmpfs /dev/shm && exec {} {}",
            exe.display(),
            pidfile.display()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid: i32 = wait_for_file(&pidfile).parse().unwrap();
    // If the test fails midway, let the job go on and exit by itself.
    let mut cleanup = Cleanup::new(None);
    cleanup.pids.push(pid as u32);

    let mut tracer = Command::new(shmtrace())
        .args(["--pid", &pid.to_string(), "--report"])
        .arg(&report)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until shmtrace says it is attached, then let the job fork.
    let (tx, rx) = mpsc::channel();
    let stderr = tracer.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = String::new();
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("shmtrace never attached");
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("tracing pid") {
            break;
        }
    }
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pid, libc::SIGUSR1) };

    let out = job.wait_with_output().unwrap();
    let truth = truth(&String::from_utf8_lossy(&out.stdout));
    let child = truth["child"].as_u64().unwrap();
    // shmtrace stops by itself once the job and its child are gone.
    let start = Instant::now();
    let status = loop {
        if let Some(st) = tracer.try_wait().unwrap() {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "shmtrace did not stop after the job exited"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    while let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
        seen.push_str(&line);
        seen.push('\n');
    }
    assert!(status.success(), "{seen}");
    let r: serde_json::Value = read_report(&report);
    let f = &r["first_failure"];
    assert_eq!(f["pid"].as_u64(), Some(child), "{seen}");
    assert_eq!(f["ppid"].as_u64(), Some(pid as u64));
    assert_eq!(f["kind"], "sigbus");
    assert_eq!(f["path"], "/dev/shm/late");
    assert_eq!(
        f["offset"].as_u64(),
        Some(4 << 20),
        "the first page past 4 MiB"
    );
    assert_eq!(r["target_pid"].as_u64(), Some(pid as u64));
    let _ = std::fs::remove_dir_all(dir);
}
