//! Node-wide incidents: each /dev/shm that fails is its own story, with its
//! own first failure and diagnosis, written to its own file; bytes written
//! through duplicated fds (shell redirection, dd) are attributed.

use std::{
    io::{BufRead, BufReader, Read},
    process::{Command, Stdio},
};

use serde_json::Value;
use shmtrace_tests::*;

/// A "pod": a mount namespace of its own with a 32 MiB /dev/shm that dd
/// overfills; prints its pid (dd's, after exec) first.
fn pod(file: &str) -> u64 {
    let script = format!(
        "mount -t tmpfs -o size=32m tmpfs /dev/shm && echo $$ && \
         exec dd if=/dev/zero of=/dev/shm/{file} bs=1M count=40"
    );
    let argv = in_private_ns(&script);
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn incident_of(r: &Value, pid: u64) -> Option<&Value> {
    r["incidents"]
        .as_array()?
        .iter()
        .find(|i| i["first_failure"]["pid"].as_u64() == Some(pid))
}

#[test]
fn two_pods_filling_their_dev_shm_one_after_the_other_are_two_incidents() {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("incidents");
    let (report, incidents) = (dir.join("r.json"), dir.join("incidents"));
    let mut cleanup = Cleanup::new(None);
    let mut tracer = start_node_wide_piped(
        &[
            "--incident-quiet",
            "2",
            "--incidents-dir",
            incidents.to_str().unwrap(),
        ],
        &report,
    );
    cleanup.pids.push(tracer.id());
    let a = pod("a");
    // The second pod fills its /dev/shm once the first one's incident is
    // open: one after the other, on two mounts.
    report_until(&report, "the first pod's incident", |r| {
        incident_of(r, a).is_some()
    });
    let b = pod("b");
    // Both closed: quiet for 2 s after their last failure.
    let r = report_until(&report, "two closed incidents", |r| {
        [a, b]
            .iter()
            .all(|p| incident_of(r, *p).is_some_and(|i| i["state"] == "closed"))
    });
    let (ia, ib) = (incident_of(&r, a).unwrap(), incident_of(&r, b).unwrap());
    assert_ne!(ia["id"], ib["id"]);
    assert!(
        ia["id"].as_u64() < ib["id"].as_u64(),
        "ordered by first failure"
    );
    for (i, pid, file) in [(ia, a, "a"), (ib, b, "b")] {
        assert_eq!(i["first_failure"]["path"], format!("/dev/shm/{file}"));
        assert_eq!(i["mount"]["size_bytes"], 32 << 20);
        let d = &i["diagnosis"];
        let summary = d["summary"].as_str().unwrap();
        assert!(
            summary.starts_with(&format!("pid {pid} (dd)")) && !summary.contains("collateral"),
            "{summary}"
        );
        assert_eq!(d["recommended_shm_bytes"], 64 << 20, "{d}");
    }
    // Pod B's own failure is first in its incident, not later in A's.
    assert!(
        ia["failures"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["pid"].as_u64() != Some(b)),
        "{}",
        ia["failures"]
    );
    // One file per incident, final (closed), named by time and subject.
    let mut files: Vec<String> = std::fs::read_dir(&incidents)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let ours: Vec<Value> = files
        .iter()
        .map(|f| read_incident(&incidents.join(f)))
        .filter(|i| [a, b].contains(&i["first_failure"]["pid"].as_u64().unwrap()))
        .collect();
    assert_eq!(ours.len(), 2, "{files:?}");
    assert!(ours.iter().all(|i| i["state"] == "closed"));
    assert!(
        files
            .iter()
            .all(|f| f.starts_with("shm-incident-") && f.ends_with(".json"))
    );
    // Log collectors get one line per incident opened and closed.
    signal(tracer.id(), libc::SIGTERM);
    let mut out = String::new();
    tracer
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(tracer.wait().unwrap().success());
    for pid in [a, b] {
        for event in ["opened", "closed"] {
            assert!(
                out.lines().any(|l| {
                    let v: Value = serde_json::from_str(l).unwrap();
                    v["event"] == event && v["first_pid"].as_u64() == Some(pid)
                }),
                "{event} {pid}: {out}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bytes_written_through_duplicated_fds_are_attributed() {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("dup");
    let report = dir.join("r.json");
    let mut cleanup = Cleanup::new(None);
    let port = 24000 + std::process::id() % 1000;
    let mut tracer = start_node_wide(&["--metrics", &format!("127.0.0.1:{port}")], &report);
    cleanup.pids.push(tracer.id());
    // The shell opens fd 3 with O_CREAT (on fd 10, then moved: fcntl
    // F_DUPFD + close); dd writes to its stdout, a dup2 of a redirection.
    let script = "mount -t tmpfs -o size=64m tmpfs /dev/shm && echo $$ && \
        exec 3>/dev/shm/held && \
        dd if=/dev/zero bs=1M count=20 >&3 2>/dev/null && \
        dd if=/dev/zero of=/dev/shm/dd bs=1M count=12 2>/dev/null && \
        exec sleep 30";
    let argv = in_private_ns(script);
    let mut job = Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    cleanup.pids.push(job.id());
    let mut line = String::new();
    BufReader::new(job.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid: u64 = line.trim().parse().unwrap();
    let file = |r: &Value, name: &str| -> Option<Value> {
        r["files"]
            .as_array()?
            .iter()
            .find(|f| f["name"] == name && f["allocated_bytes"].as_u64() > Some(0))
            .cloned()
    };
    let r = report_until(&report, "both files measured", |r| {
        file(r, "held").is_some_and(|f| f["allocated_bytes"] == 20 << 20)
            && file(r, "dd").is_some_and(|f| f["allocated_bytes"] == 12 << 20)
    });
    let held = file(&r, "held").unwrap();
    // Still held by the shell (now sleep, same pid) through fd 3.
    assert!(
        held["fd_holders"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_u64() == Some(pid)),
        "{held}"
    );
    let proc_ = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .unwrap()
        .clone();
    assert!(proc_["held_bytes"].as_u64() >= Some(20 << 20), "{proc_}");
    // dd exited and left its file, which nobody holds: left behind.
    let metrics = http_get(port, "/metrics");
    let leftover: u64 = metrics
        .lines()
        .find(|l| l.starts_with("shmtrace_shm_leftover_bytes{") && l.contains("container=\"\""))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(leftover >= 12 << 20, "{leftover}");
    // Removed (through the job's own root): freed, it leaves the totals.
    std::fs::remove_file(format!("/proc/{pid}/root/dev/shm/dd")).unwrap();
    report_until(&report, "the freed file gone", |r| {
        r["files"]
            .as_array()
            .is_some_and(|fs| !fs.iter().any(|f| f["name"] == "dd"))
    });
    let _ = job.kill();
    let _ = job.wait();
    signal(tracer.id(), libc::SIGTERM);
    let _ = tracer.wait();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sendfile_splice_and_copy_file_range_into_a_full_tmpfs_are_failures() {
    let script = root_dir().join("tests/python/copy_into_tmpfs.py");
    let t = run_traced(
        &["--shm-size", "8M"],
        &["/usr/bin/python3".to_string(), script.display().to_string()],
    );
    let said = truth(&t.stdout());
    for call in ["sendfile", "splice", "copy_file_range"] {
        assert_eq!(said[call], "ENOSPC", "{call}: {said}");
        let f = t
            .failures()
            .iter()
            .find(|f| f["syscall"] == call)
            .unwrap_or_else(|| panic!("no {call} failure: {}", t.report["failures"]));
        assert_eq!(f["kind"], "enospc");
        assert_eq!(f["reason"], "tmpfs_full");
        assert_eq!(f["path"], format!("/dev/shm/{call}"), "{f}");
    }
    assert_eq!(t.first()["syscall"], "sendfile");
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child we started.
    unsafe { libc::kill(pid as i32, sig) };
}

/// The closing summary and `-o json` tell each incident on its own: the
/// second mount's failure is the first of its own block, never collateral
/// of the first.
#[test]
fn the_closing_summary_and_json_give_one_story_per_incident() {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("summary");
    let report = dir.join("r.json");
    let mut cleanup = Cleanup::new(None);
    let mut tracer = Command::new(shmtrace())
        .args(["-o", "json", "--report"])
        .arg(&report)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    cleanup.pids.push(tracer.id());
    let mut err = BufReader::new(tracer.stderr.take().unwrap());
    let (line, notes) = first_status_line(&mut err);
    assert!(line.contains("tracing every process"), "{notes:?} {line}");
    // Drained beside us: the once-a-second lines must not fill the pipe.
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let a = pod("a");
    report_until(&report, "the first pod's incident", |r| {
        incident_of(r, a).is_some()
    });
    let b = pod("b");
    report_until(&report, "the second pod's incident", |r| {
        incident_of(r, b).is_some()
    });
    signal(tracer.id(), libc::SIGTERM);
    let mut out = String::new();
    tracer
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(tracer.wait().unwrap().success());
    let summary = stderr.join().unwrap();

    // Blocks as printed: "incident N (...): MOUNT", then its story.
    let blocks: Vec<&str> = summary.split("\nincident ").skip(1).collect();
    let block_of = |pid: u64| {
        blocks
            .iter()
            .find(|b| {
                b.lines()
                    .any(|l| l.starts_with("  first failure") && l.contains(&format!("pid {pid} ")))
            })
            .unwrap_or_else(|| panic!("no incident block for pid {pid}:\n{summary}"))
    };
    let (ba, bb) = (block_of(a), block_of(b));
    for (blk, other, file) in [(ba, b, "a"), (bb, a, "b")] {
        assert!(
            blk.lines().next().unwrap().contains("/dev/shm (mount ns "),
            "the mount as the pod sees it: {blk}"
        );
        assert!(blk.contains(&format!("/dev/shm/{file}")), "{blk}");
        assert!(
            !blk.contains(&format!("pid {other} ")),
            "collateral crossed mounts:\n{blk}"
        );
        assert!(blk.contains("  diagnosis      [shm:enospc-write]"), "{blk}");
        assert!(blk.contains("  fix            /dev/shm of 64 MiB"), "{blk}");
    }
    // -o json: one incident line each, after the failure lines.
    let incident_line = |pid: u64| -> Value {
        out.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .find(|v| v["type"] == "incident" && v["incident"]["first_failure"]["pid"] == pid)
            .unwrap_or_else(|| panic!("no incident line for {pid}:\n{out}"))
    };
    for (pid, other) in [(a, b), (b, a)] {
        let i = incident_line(pid);
        let i = &i["incident"];
        assert_eq!(i["diagnosis"]["recommended_shm_bytes"], 64 << 20, "{i}");
        assert!(
            i["failures"]
                .as_array()
                .unwrap()
                .iter()
                .all(|f| f["pid"] != other),
            "{i}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
