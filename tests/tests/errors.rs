//! Bad input and hostile environments: a clear message, a non-zero exit,
//! and nothing left behind.

use std::process::{Command, Output, Stdio};

use serde_json::Value;
use shmtrace_tests::*;

fn sh(script: &str) -> Output {
    require_root();
    let _lock = bpf_lock(false);
    Command::new("sh")
        .arg("-c")
        .arg(script.replace("SHMTRACE", &shmtrace().display().to_string()))
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn not_root() {
    let o = sh("setpriv --reuid=65534 --regid=65534 --clear-groups SHMTRACE run -- true");
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("not running as root") && e.contains("sudo"),
        "{e}"
    );
}

#[test]
fn root_without_the_capabilities() {
    let o =
        sh("setpriv --inh-caps=-all --bounding-set=-bpf,-perfmon,-sys_admin SHMTRACE run -- true");
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("CAP_BPF") && e.contains("CAP_PERFMON"), "{e}");
    assert!(!e.contains("CAP_SYS_PTRACE"), "it still has that one: {e}");
}

#[test]
fn no_btf() {
    let o = sh(
        "unshare -m --propagation private sh -c 'mount -t tmpfs none /sys/kernel/btf && SHMTRACE run -- true'",
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("BTF"), "{}", stderr(&o));
}

#[test]
fn tracefs_not_mounted_is_mounted_by_shmtrace() {
    let o = sh("unshare -m --propagation private sh -c \
                'umount /sys/kernel/tracing 2>/dev/null; umount /sys/kernel/debug/tracing 2>/dev/null; \
                 SHMTRACE run -- true'");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("mounted tracefs"), "{}", stderr(&o));
}

#[test]
fn tracefs_that_cannot_be_mounted_says_how() {
    // /sys/kernel becomes a read-only tmpfs holding only btf: there is no
    // tracefs and no directory to mount one on.
    let o = sh("unshare -m --propagation private sh -c '\
                mkdir -p /run/shmtrace-test-btf && mount --bind /sys/kernel/btf /run/shmtrace-test-btf && \
                mount -t tmpfs none /sys/kernel && mkdir /sys/kernel/btf && \
                mount --bind /run/shmtrace-test-btf /sys/kernel/btf && mount -o remount,ro,bind /sys/kernel 2>/dev/null; \
                mount -o remount,ro /sys/kernel; SHMTRACE run -- true'");
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("tracefs") && e.contains("mount -t tracefs nodev /sys/kernel/tracing"),
        "{e}"
    );
}

#[test]
fn unknown_pid() {
    let o = sh("SHMTRACE --pid 4194000");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no process with pid 4194000"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn command_not_found() {
    let o = sh("SHMTRACE run -- /nonexistent/train.py");
    assert_eq!(o.status.code(), Some(127));
    assert!(
        stderr(&o).contains("cannot run `/nonexistent/train.py`: command not found"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn pid_with_a_subcommand_is_refused() {
    let o = sh("SHMTRACE --pid 1 run -- true");
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--pid cannot be combined"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn options_of_another_mode_are_usage_errors_not_ignored() {
    // Each is refused before anything runs (the marker stays absent).
    let dir = scratch("modes");
    let marker = dir.join("ran");
    let m = marker.display();
    for (args, says) in [
        (
            "doctor --metrics :9466".to_string(),
            "unexpected argument '--metrics'",
        ),
        (
            format!("run -n kube-system -- touch {m}"),
            "unexpected argument '-n'",
        ),
        (
            format!("--metrics :9466 run -- touch {m}"),
            "is a node-wide option",
        ),
        (
            format!("--report r.json run -- touch {m}"),
            "goes after the subcommand",
        ),
        ("--pid 1 --ns-grace 5".to_string(), "cannot be used with"),
    ] {
        let o = sh(&format!("SHMTRACE {args}"));
        assert_eq!(o.status.code(), Some(2), "{args}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args}: {}", stderr(&o));
        assert!(!marker.exists(), "{args} ran the job");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Names of loaded BPF programs (bpftool truncates them to 15 bytes).
fn loaded_programs() -> Vec<String> {
    let out = Command::new("bpftool")
        .args(["-j", "prog", "show"])
        .output()
        .expect("bpftool");
    let v: Value = serde_json::from_slice(&out.stdout).expect("bpftool json");
    v.as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str().map(String::from))
        .collect()
}

const OURS: &[&str] = &[
    "sys_exit",
    "signal_generate",
    "sched_process_fo",
    "sched_process_ex",
    "signal_deliver",
    "oom_mark_victim",
    "cuda_ipc_",
    "cu_ipc_",
];

fn ours(names: &[String]) -> Vec<String> {
    names
        .iter()
        .filter(|n| OURS.iter().any(|o| n.starts_with(o)))
        .cloned()
        .collect()
}

/// The kernel frees programs asynchronously (RCU, a workqueue) once the last
/// fd is closed: give it a moment before calling one leaked.
fn none_of_ours_left() -> Result<(), Vec<String>> {
    for _ in 0..50 {
        if ours(&loaded_programs()).is_empty() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Err(ours(&loaded_programs()))
}

#[test]
fn nothing_stays_attached_after_exit_or_ctrl_c() {
    require_root();
    // Exclusive: no other test's shmtrace may be running while we count.
    let _lock = bpf_lock(true);
    none_of_ours_left().expect("programs left by something else");
    let dir = scratch("leak");
    let during = dir.join("during.json");
    // While the command runs, our programs are loaded...
    let st = Command::new(shmtrace())
        .args(["run", "--quiet", "--", "sh", "-c"])
        .arg(format!("bpftool -j prog show > {}", during.display()))
        .status()
        .unwrap();
    assert!(st.success());
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&during).unwrap()).unwrap();
    let names: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str().map(String::from))
        .collect();
    assert!(
        ours(&names).len() >= 6,
        "programs loaded while tracing: {names:?}"
    );
    // ...and after it ends, none are.
    none_of_ours_left().expect("left loaded after the run");

    // Ctrl-C on --pid detaches and still writes the report.
    let mut job = Command::new("sleep").arg("30").spawn().unwrap();
    let report = dir.join("r.json");
    let mut tracer = Command::new(shmtrace())
        .args(["--pid", &job.id().to_string(), "--report"])
        .arg(&report)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while ours(&loaded_programs()).len() < 6 {
        assert!(start.elapsed().as_secs() < 20, "shmtrace never attached");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // SAFETY: plain kill(2).
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    let st = tracer.wait().unwrap();
    assert!(st.success());
    let r: Value = read_report(&report);
    assert_eq!(r["target_pid"].as_u64(), Some(job.id() as u64));
    none_of_ours_left().expect("left loaded after Ctrl-C");
    let _ = job.kill();
    let _ = job.wait();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn hostile_names_are_escaped_everywhere() {
    let exe = workload("hostile");
    let t = run_traced(
        &[],
        &private_shm("size=4m", &format!("exec {}", exe.display())),
    );
    let f = t.first();
    assert_eq!(f["kind"], "sigbus", "{}", t.stderr());
    let path = f["path"].as_str().unwrap();
    assert_eq!(path, "/dev/shm/bad\\x0a\\x1b[31mname\\xff\\xe2\\x80\\xae");
    assert_eq!(f["comm"].as_str().unwrap(), "ev\\x0a\\x1b[2Jil");
    // The summary carries no raw control bytes from the process.
    let raw = &t.output.stderr;
    assert!(!raw.contains(&0x1b), "escape byte reached the terminal");
    assert!(
        !raw.windows(4).any(|w| w == b"bad\n"),
        "newline in a name reached the terminal"
    );
    assert!(
        t.stderr().contains("bad\\x0a\\x1b[31mname"),
        "{}",
        t.stderr()
    );
    // Every --events line is valid JSON with the escaped forms.
    assert!(t.events.iter().any(|e| e["comm"] == "ev\\x0a\\x1b[2Jil"));
}

#[test]
fn the_daemonset_manifest_runs_flags_shmtrace_accepts() {
    // Its container args, read by a YAML parser, run node-wide as the
    // DaemonSet runs them (every flag is parsed, none ignored): ready on
    // the probes' /healthz, and the final report written on SIGTERM.
    let manifest = root_dir().join("deploy/daemonset.yaml");
    let args = Command::new("/usr/bin/python3")
        .args(["-c", "import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); print('\\n'.join(d['spec']['template']['spec']['containers'][0]['args']))"])
        .arg(&manifest)
        .output()
        .unwrap();
    assert!(
        args.status.success(),
        "{}",
        String::from_utf8_lossy(&args.stderr)
    );
    let args: Vec<String> = String::from_utf8_lossy(&args.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert!(args.iter().any(|a| a == "--metrics"), "{args:?}");
    let dir = scratch("manifest");
    let port = 23000 + std::process::id() % 1000;
    let args: Vec<String> = args
        .into_iter()
        .map(|a| a.replace("/var/lib/shmtrace", &dir.display().to_string()))
        .map(|a| a.replace("0.0.0.0:9464", &format!("127.0.0.1:{port}")))
        .collect();
    let _lock = bpf_lock(false);
    let mut agent = Command::new(shmtrace())
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut cleanup = Cleanup::new(None);
    cleanup.pids.push(agent.id());
    let (line, notes) =
        first_status_line(&mut std::io::BufReader::new(agent.stderr.as_mut().unwrap()));
    assert!(
        line.contains("tracing every process"),
        "{args:?}: {notes:?} {line}"
    );
    assert_eq!(http_get(port, "/healthz").trim(), "ok");
    // SAFETY: plain kill(2) of the child.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    assert!(agent.wait().unwrap().success());
    let r: Value = read_report(&dir.join("report.json"));
    assert_eq!(r["mode"], "node");
    assert!(dir.join("incidents").is_dir());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn reports_never_follow_a_planted_name_and_devices_are_written_in_place() {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("planted");
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious").unwrap();
    // Whoever can write to the report's directory plants links: at the
    // report's own name, at the temporary name earlier versions used, and
    // at the events file.
    let report = dir.join("r.json");
    std::os::unix::fs::symlink(&victim, &report).unwrap();
    std::os::unix::fs::symlink(&victim, dir.join("r.tmp-shmtrace")).unwrap();
    // `shmtrace run --quiet FLAG PATH -- true`
    let run_with = |flag: &str, path: &std::path::Path| {
        Command::new(shmtrace())
            .args(["run", "--quiet", flag])
            .arg(path)
            .args(["--", "true"])
            .output()
            .unwrap()
    };
    let out = run_with("--report", &report);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(std::fs::symlink_metadata(&report).unwrap().is_file());
    let r: Value = read_report(&report);
    assert_eq!(r["mode"], "run");

    let events = dir.join("e.jsonl");
    std::os::unix::fs::symlink(&victim, &events).unwrap();
    let out = run_with("--events", &events);
    assert!(!out.status.success(), "a symlinked --events is refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("symlink"), "{err}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");

    // A device node as the report: written in place, never replaced by a
    // regular file (this one is a private copy of /dev/null).
    let dev = dir.join("null");
    let c = std::ffi::CString::new(dev.to_str().unwrap()).unwrap();
    // SAFETY: mknod with a valid NUL-terminated path.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(rc, 0, "mknod");
    let out = run_with("--report", &dev);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(&dev)
            .unwrap()
            .file_type()
            .is_char_device()
    );
    let strays: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(strays.is_empty(), "{strays:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_report_that_cannot_be_written_is_refused_before_the_job_runs() {
    // A read-only directory: the probe file cannot be created there, so
    // the job never starts (the marker stays absent).
    let dir = scratch("ro-report");
    let marker = dir.join("ran");
    let o = sh(&format!(
        "unshare -m --propagation private sh -c 'mkdir -p {d}/ro && mount -t tmpfs -o ro tmpfs {d}/ro && \
         SHMTRACE run --report {d}/ro/r.json -- touch {m}'",
        d = dir.display(),
        m = marker.display()
    ));
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("cannot create report file") && e.contains("r.json"),
        "{e}"
    );
    assert!(
        !marker.exists(),
        "the job ran although its report could not be written"
    );
    let o = sh(&format!(
        "unshare -m --propagation private sh -c 'mkdir -p {d}/ro && mount -t tmpfs -o ro tmpfs {d}/ro && \
         SHMTRACE run --incidents-dir {d}/ro -- touch {m}'",
        d = dir.display(),
        m = marker.display()
    ));
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("cannot write incidents to"), "{e}");
    assert!(
        !marker.exists(),
        "the job ran although its incidents could not be written"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_report_that_fails_at_the_end_keeps_the_diagnosis_and_the_job_status() {
    // The job itself makes the report's directory read-only, then fills a
    // 1 MiB /dev/shm and exits 3: the summary is still printed, the error
    // says where the report could not go, and the exit status is the job's.
    let dir = scratch("late-ro-report");
    let o = sh(&format!(
        "unshare -m --propagation private sh -c 'mount -t tmpfs -o size=1m tmpfs /dev/shm && \
         mkdir -p {d}/out && mount -t tmpfs -o size=1m tmpfs {d}/out && \
         SHMTRACE run --report {d}/out/r.json -- sh -c \"mount -o remount,ro {d}/out; \
         head -c 2000000 /dev/zero > /dev/shm/x; exit 3\"'",
        d = dir.display()
    ));
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{e}");
    assert!(e.contains("NOT written"), "{e}");
    assert!(e.contains("r.json"), "{e}");
    let all = format!("{}{e}", String::from_utf8_lossy(&o.stdout));
    assert!(all.contains("first process to fail"), "no diagnosis: {all}");
    assert!(all.contains("ENOSPC") || all.contains("No space"), "{all}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Detaching the hooks costs the kernel ~2 s (an RCU grace period per
/// tracepoint); shmtrace hands that to a detached holder instead of making
/// the user wait, and the per-namespace anchors it forks keep none of its
/// descriptors (else the last close waits on them).
#[test]
fn run_returns_with_its_job_and_anchors_hold_none_of_its_descriptors() {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("exit");
    let (fds, end) = (dir.join("anchor-fds"), dir.join("end"));
    let script = format!(
        "echo x > /dev/shm/a; i=0; \
         while [ -z \"$(pgrep -P $PPID -x shmtrace-anchor)\" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; \
         for p in $(pgrep -P $PPID -x shmtrace-anchor); do ls -l /proc/$p/fd/; done > {}; \
         date +%s.%N > {}",
        fds.display(),
        end.display()
    );
    let out = Command::new(shmtrace())
        .args(["run", "--shm-size", "8m", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    let returned = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(out.status.success(), "{}", stderr(&out));
    let listing = std::fs::read_to_string(&fds).unwrap();
    assert!(
        listing.contains("/proc/") || listing.contains("->"),
        "no anchor seen: {listing:?}"
    );
    for bad in ["anon_inode", "socket:", "bpf"] {
        assert!(!listing.contains(bad), "an anchor holds {bad}:\n{listing}");
    }
    let ended: f64 = std::fs::read_to_string(&end)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Generous against a loaded machine; the detach alone took 2.1 s.
    assert!(
        returned - ended < 1.0,
        "shmtrace returned {:.2} s after its job",
        returned - ended
    );
    let _ = std::fs::remove_dir_all(dir);
}
