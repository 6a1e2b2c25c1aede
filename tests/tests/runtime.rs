//! A real container runtime (Podman from Debian, runc): a container with
//! the runtime's default /dev/shm fills it while shmtrace runs node-wide;
//! and shmtrace itself in a container the way the DaemonSet runs it (host
//! PID namespace, read-only root, exactly the manifest's capabilities).
//! No registry: the image is a skeleton root with the host's /usr bound in.

use std::{
    io::BufReader,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use serde_json::Value;
use shmtrace_tests::*;

/// The DaemonSet manifest's capabilities, read from deploy/daemonset.yaml.
fn manifest_caps() -> Vec<String> {
    let text = std::fs::read_to_string(root_dir().join("deploy/daemonset.yaml")).unwrap();
    let add = text
        .split("add:")
        .nth(1)
        .expect("capabilities.add in the manifest");
    add.lines()
        .skip(1)
        .map_while(|l| l.trim().strip_prefix("- "))
        .map(|c| c.split_whitespace().next().unwrap().to_string())
        .collect()
}

/// A root for `podman run --rootfs`: merged-/usr links, passwd/group, the
/// files runc bind-mounts over, and mount points for what we bind in.
fn rootfs(dir: &Path) -> PathBuf {
    let root = dir.join("rootfs");
    for d in [
        "usr",
        "etc",
        "dev",
        "proc",
        "sys",
        "tmp",
        "run",
        "opt",
        "var/lib/shmtrace",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for l in ["bin", "sbin", "lib", "lib64"] {
        let _ = std::os::unix::fs::symlink(format!("usr/{l}"), root.join(l));
    }
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(root.join("etc/group"), "root:x:0:\n").unwrap();
    for f in [
        "etc/hosts",
        "etc/resolv.conf",
        "etc/hostname",
        "etc/ld.so.cache",
        "opt/shmtrace",
    ] {
        std::fs::write(root.join(f), "").unwrap();
    }
    std::fs::create_dir_all(root.join("etc/alternatives")).unwrap();
    root
}

/// `podman run` with what this machine needs (runc, our rlimits: the
/// defaults exceed them and setrlimit fails), the host's /usr bound in.
fn podman_run(name: &str, extra: &[String], rootfs: &Path, cmd: &[&str]) -> Command {
    let nofile = rlimit(libc::RLIMIT_NOFILE);
    let nproc = rlimit(libc::RLIMIT_NPROC).min(32768);
    let mut c = Command::new("podman");
    c.args([
        "run",
        "--rm",
        "--runtime",
        "runc",
        "--network",
        "none",
        "--read-only",
    ])
    .args(["--name", name])
    .arg(format!("--ulimit=nofile={nofile}:{nofile}"))
    .arg(format!("--ulimit=nproc={nproc}:{nproc}"))
    .args([
        "-v",
        "/usr:/usr:ro",
        "-v",
        "/etc/alternatives:/etc/alternatives:ro",
    ])
    .args(["-v", "/etc/ld.so.cache:/etc/ld.so.cache:ro"])
    .args(extra)
    .arg("--rootfs")
    .arg(rootfs)
    .args(cmd);
    c
}

fn rlimit(r: libc::__rlimit_resource_t) -> u64 {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own.
    unsafe { libc::getrlimit(r, &mut l) };
    l.rlim_max
}

fn require_podman() {
    let ok = Command::new("podman")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "podman is missing: run scripts/setup.sh --test");
}

/// Root, podman, the shared lock, a scratch directory and a root for it.
fn podman_test(name: &str) -> (BpfLock, PathBuf, PathBuf) {
    require_root();
    require_podman();
    let lock = bpf_lock(false);
    let dir = scratch(name);
    let root = rootfs(&dir);
    (lock, dir, root)
}

/// Runs container `name` whose dd writes `mib` MiB to /dev/shm/`file` (more
/// than it holds), then stays `linger` seconds (to be named while alive).
fn fill_in_container(name: &str, extra: &[String], root: &Path, file: &str, mib: u32, linger: u32) {
    let script =
        format!("dd if=/dev/zero of=/dev/shm/{file} bs=1M count={mib} 2>&1; sleep {linger}");
    let out = podman_run(name, extra, root, &["/bin/sh", "-c", &script])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("No space left"),
        "{}",
        text(&out)
    );
}

fn rm(name: &str) {
    let _ = Command::new("podman")
        .args(["rm", "-f", "-t", "0", name])
        .output();
}

/// Removes the container when the test ends, a failed assertion included:
/// a node-wide shmtrace left running in one would trace the other tests.
struct Removed(String);

impl Drop for Removed {
    fn drop(&mut self) {
        rm(&self.0);
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn a_podman_container_filling_its_default_dev_shm_is_an_incident_named_by_the_runtime() {
    let (_lock, dir, root) = podman_test("podman");
    let (report, incidents) = (dir.join("r.json"), dir.join("incidents"));
    let port = 23000 + std::process::id() % 1000;
    let mut cleanup = Cleanup::new(None);
    let mut tracer = start_node_wide(
        &[
            "--incidents-dir",
            incidents.to_str().unwrap(),
            "--incident-quiet",
            "2",
            "--metrics",
            &format!("127.0.0.1:{port}"),
        ],
        &report,
    );
    cleanup.pids.push(tracer.id());
    let name = format!("shmtrace-test-{}", std::process::id());
    rm(&name);
    // Holds the 64 MiB default with dd, then waits so the container is
    // still there when shmtrace names it.
    fill_in_container(&name, &[], &root, "fill", 80, 4);
    let r = report_until(&report, "the container's incident, closed", |r| {
        r["incidents"].as_array().is_some_and(|is| {
            is.iter()
                .any(|i| i["container"]["name"].as_str() == Some(&name) && i["state"] == "closed")
        })
    });
    let i = r["incidents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["container"]["name"].as_str() == Some(&name))
        .unwrap();
    let id = i["container"]["container_id"].as_str().unwrap();
    assert_eq!(i["container"]["runtime"], "podman");
    assert_eq!(id.len(), 64);
    // As the container sees it: /dev/shm, its own pids; the host's beside.
    let f = &i["first_failure"];
    assert_eq!(f["path"], "/dev/shm/fill", "{f}");
    assert!(
        f["host_path"]
            .as_str()
            .is_some_and(|p| p.contains(id) && p.ends_with("/userdata/shm/fill")),
        "{f}"
    );
    assert!(
        f["ns_pid"]
            .as_u64()
            .is_some_and(|n| n < 100 && n != f["pid"].as_u64().unwrap()),
        "{f}"
    );
    assert_eq!(i["mount"]["mountpoint"], "/dev/shm");
    // Podman's default: size=64000k.
    assert_eq!(i["mount"]["size_bytes"], 65_536_000, "{}", i["mount"]);
    let d = &i["diagnosis"];
    assert_eq!(d["recommended_shm_bytes"], 128 << 20, "{d}");
    assert!(
        d["runtime_fix"]
            .as_str()
            .is_some_and(|s| s.starts_with("podman run --shm-size=128m") && s.contains(&name)),
        "{d}"
    );
    // The incident file names the container.
    let file = std::fs::read_dir(&incidents)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.contains(&name))
        .expect("an incident file named after the container");
    let saved: Value = read_incident(&incidents.join(&file));
    assert_eq!(saved["container"]["container_id"], id);
    // Metrics: the container's /dev/shm by name, no pid label.
    let metrics = http_get(port, "/metrics");
    let line = metrics
        .lines()
        .find(|l| l.starts_with("shmtrace_tmpfs_size_bytes") && l.contains(&name))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(
        line.ends_with(" 65536000") && !line.contains("pid="),
        "{line}"
    );
    // Kept for the README: what an operator sees.
    let _ = std::fs::write(
        dir.join("../podman-incident.json"),
        serde_json::to_string_pretty(&saved).unwrap(),
    );
    let _ = std::fs::write(dir.join("../podman-metrics.txt"), &metrics);
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGTERM) };
    let _ = tracer.wait();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn shmtrace_runs_in_a_container_with_the_manifests_capabilities_and_no_more() {
    let (_lock, dir, root) = podman_test("daemonset");
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let caps = manifest_caps();
    assert!(caps.contains(&"BPF".to_string()), "{caps:?}");
    let bind =
        |host: &str, ctr: &str, mode: &str| vec!["-v".to_string(), format!("{host}:{ctr}:{mode}")];
    let base = |caps: &[String]| -> Vec<String> {
        let mut v = vec!["--pid=host".to_string(), "--cap-drop=ALL".to_string()];
        if !caps.is_empty() {
            v.push(format!("--cap-add={}", caps.join(",")));
        }
        for (h, c, m) in [
            ("/sys/kernel/btf", "/sys/kernel/btf", "ro"),
            ("/sys/kernel/tracing", "/sys/kernel/tracing", "ro"),
            ("/sys/fs/cgroup", "/sys/fs/cgroup", "ro"),
            (shmtrace().to_str().unwrap(), "/opt/shmtrace", "ro"),
            (state.to_str().unwrap(), "/var/lib/shmtrace", "rw"),
        ] {
            v.extend(bind(h, c, m));
        }
        v
    };
    // No capabilities, or all but SYS_ADMIN (this kernel refuses its maps
    // then): a clear error naming what is missing, not a half-working tracer.
    let name = format!("shmtrace-ds-{}", std::process::id());
    rm(&name);
    let _removed = Removed(name.clone());
    let no_admin: Vec<String> = caps.iter().filter(|c| *c != "SYS_ADMIN").cloned().collect();
    for (set, says) in [(Vec::new(), "CAP_BPF"), (no_admin, "CAP_SYS_ADMIN")] {
        let mut run = podman_run(&name, &base(&set), &root, &["/opt/shmtrace", "--quiet"]);
        let mut child = run
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Should it start tracing after all, do not wait forever.
        let start = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(100));
        }
        rm(&name);
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "{set:?}: {}", text(&out));
        assert!(text(&out).contains(says), "{set:?}: {}", text(&out));
    }
    // Exactly the manifest's: it traces the node.
    let mut ds = podman_run(
        &name,
        &base(&caps),
        &root,
        &[
            "/opt/shmtrace",
            "--quiet",
            "--report",
            "/var/lib/shmtrace/r.json",
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let (line, notes) = first_status_line(&mut BufReader::new(ds.stderr.as_mut().unwrap()));
    assert!(line.contains("tracing every process"), "{notes:?} {line}");
    let argv = in_private_ns(
        "mount -t tmpfs -o size=8m tmpfs /dev/shm && echo $$ && \
         exec dd if=/dev/zero of=/dev/shm/a bs=1M count=10",
    );
    let job = Command::new(&argv[0])
        .args(&argv[1..])
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let pid: u64 = String::from_utf8_lossy(&job.stdout).trim().parse().unwrap();
    // Node-wide it sees the other tests' containers too: find this job's.
    let ours = |r: &Value| -> Option<Value> {
        r["failures"]
            .as_array()?
            .iter()
            .find(|f| f["pid"].as_u64() == Some(pid))
            .cloned()
    };
    let r = report_until(&state.join("r.json"), "the host job's failure", |r| {
        ours(r).is_some()
    });
    let f = ours(&r).unwrap();
    assert_eq!(f["path"], "/dev/shm/a");
    assert_eq!(f["mount"]["size_bytes"], 8 << 20);
    assert!(
        r["notes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| !n.as_str().unwrap().contains("PID namespace")),
        "{}",
        r["notes"]
    );
    let _ = Command::new("podman")
        .args(["kill", "--signal", "TERM", &name])
        .output();
    let _ = ds.wait();
    rm(&name);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_live_stream_follows_container_filters_as_json_lines() {
    let (_lock, dir, root) = podman_test("filter");
    let report = dir.join("r.json");
    let (a, b) = (
        format!("shmtrace-fa-{}", std::process::id()),
        format!("shmtrace-fb-{}", std::process::id()),
    );
    let mut cleanup = Cleanup::new(None);
    let tracer = start_node_wide_piped(&["-o", "json", "-c", &a], &report);
    cleanup.pids.push(tracer.id());
    for name in [&a, &b] {
        rm(name);
        fill_in_container(name, &["--shm-size=8m".to_string()], &root, "f", 16, 2);
    }
    // Both failures are in the report; only A's is streamed.
    report_until(&report, "both containers' failures", |r| {
        [&a, &b].iter().all(|n| {
            r["failures"].as_array().is_some_and(|fs| {
                fs.iter()
                    .any(|f| f["container"]["name"].as_str() == Some(n.as_str()))
            })
        })
    });
    // Each failure is streamed when applied, before the report shows it.
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGTERM) };
    let out = tracer.into_child().wait_with_output().unwrap();
    let stream = String::from_utf8_lossy(&out.stdout);
    let failures: Vec<Value> = stream
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["type"] == "failure")
        .collect();
    assert!(!failures.is_empty(), "{stream}");
    for f in &failures {
        assert_eq!(
            f["failure"]["container"]["name"].as_str(),
            Some(a.as_str()),
            "{f}"
        );
        assert_eq!(f["failure"]["path"], "/dev/shm/f");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The device (`major:minor`) of `/dev/shm` in `pid`'s mount namespace.
fn shm_dev_of(pid: u32) -> String {
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    // The last one: a later mount on /dev/shm hides the earlier.
    info.lines()
        .rfind(|l| l.split(' ').nth(4) == Some("/dev/shm"))
        .and_then(|l| l.split(' ').nth(2))
        .unwrap_or_else(|| panic!("no /dev/shm in {pid}'s mounts:\n{info}"))
        .to_string()
}

/// Two containers and the host's own mounts in one scrape: each
/// container's /dev/shm carries its name and `container_id`, the host's
/// carry none (the runtime's setup process passes through the host's
/// namespace in the container's cgroup, which must not name it).
#[test]
fn each_mount_series_names_the_container_owning_it_and_the_hosts_name_none() {
    let (_lock, dir, root) = podman_test("labels");
    let report = dir.join("r.json");
    let port = 24000 + std::process::id() % 1000;
    let mut cleanup = Cleanup::new(None);
    let mut tracer = start_node_wide(&["--metrics", &format!("127.0.0.1:{port}")], &report);
    cleanup.pids.push(tracer.id());
    let names: Vec<String> = (0..2)
        .map(|i| format!("shmtrace-lbl{i}-{}", std::process::id()))
        .collect();
    let _removed: Vec<Removed> = names.iter().map(|n| Removed(n.clone())).collect();
    let mut runs = Vec::new();
    for n in &names {
        rm(n);
        let script = "dd if=/dev/zero of=/dev/shm/held bs=1M count=4 2>/dev/null; sleep 30";
        runs.push(
            podman_run(n, &[], &root, &["/bin/sh", "-c", script])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    let inspect = |n: &str, what: &str| -> String {
        let o = Command::new("podman")
            .args(["inspect", "-f", what, n])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let mut seen = Vec::new();
    for n in &names {
        let mut pid = 0;
        for _ in 0..100 {
            pid = inspect(n, "{{.State.Pid}}").parse().unwrap_or(0);
            if pid > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(pid > 0, "container {n} did not start");
        seen.push((n.clone(), inspect(n, "{{.Id}}"), shm_dev_of(pid)));
    }
    let host_dev = shm_dev_of(std::process::id());
    // Both containers' files seen and named (names are looked up once a
    // tick), then one scrape.
    let mut metrics = String::new();
    for _ in 0..50 {
        metrics = http_get(port, "/metrics");
        if names.iter().all(|n| {
            metrics.lines().any(|l| {
                l.starts_with("shmtrace_container_shm_held_bytes{")
                    && l.contains(&format!("container=\"{n}\""))
            })
        }) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let size_of = |dev: &str| -> String {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("shmtrace_tmpfs_size_bytes{") && l.contains(&format!("dev=\"{dev}\""))
            })
            .unwrap_or_else(|| panic!("no series for {dev}:\n{metrics}"))
            .to_string()
    };
    for (n, id, dev) in &seen {
        assert_eq!(id.len(), 64, "{id}");
        let l = size_of(dev);
        assert!(
            l.contains(&format!(
                "container=\"{n}\",container_id=\"podman://{id}\"}}"
            )),
            "{l}\n{metrics}"
        );
    }
    let l = size_of(&host_dev);
    assert!(
        l.contains("namespace=\"\",pod=\"\",container=\"\",container_id=\"\"}"),
        "the host's /dev/shm is nobody's: {l}\n{metrics}"
    );
    // No series of another mount carries these containers' names.
    for l in metrics.lines().filter(|l| l.starts_with("shmtrace_tmpfs_")) {
        for (n, _, dev) in &seen {
            if l.contains(&format!("container=\"{n}\"")) {
                assert!(l.contains(&format!("dev=\"{dev}\"")), "{l}");
            }
        }
    }
    for n in &names {
        rm(n);
    }
    for mut r in runs {
        let _ = r.wait();
    }
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGTERM) };
    let _ = tracer.wait();
    let _ = std::fs::remove_dir_all(dir);
}
