//! Test harness: runs the real shmtrace binary (real eBPF programs, loaded
//! into this kernel) against real workloads in private mount namespaces
//! with small tmpfs /dev/shm. Needs root; `scripts/test.sh` sets it all up.

pub mod guest;

use std::{
    fs::File,
    io::{BufRead, BufReader, Read},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use serde_json::Value;

/// `text` parsed as JSON and validated against schema/`schema` (the
/// committed JSON Schema of the report or the incident file): every
/// report the suite reads is checked, not only the golden ones.
fn validated(text: &str, schema: &str) -> Value {
    static VALIDATORS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<String, &'static jsonschema::Validator>>,
    > = std::sync::OnceLock::new();
    let v: Value = serde_json::from_str(text).expect("report is JSON");
    let validator = *VALIDATORS
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry(schema.to_string())
        .or_insert_with(|| {
            let path = root_dir().join("schema").join(schema);
            let s: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            Box::leak(Box::new(
                jsonschema::validator_for(&s).expect("a valid schema"),
            ))
        });
    let errors: Vec<String> = validator
        .iter_errors(&v)
        .take(10)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "the JSON does not follow schema/{schema}: {errors:#?}"
    );
    v
}

/// A report (`--report FILE`) as written, checked against its schema.
pub fn read_report(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no report at {}: {e}", path.display()));
    report_json(&text)
}

/// A report's text, parsed and checked against its schema.
pub fn report_json(text: &str) -> Value {
    validated(text, "report.v2.schema.json")
}

/// An incident file (`--incidents-dir DIR`), checked against its schema.
pub fn read_incident(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no incident at {}: {e}", path.display()));
    validated(&text, "incident.v2.schema.json")
}

pub fn root_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf()
}

/// The shmtrace binary under test: $SHMTRACE_BIN, else target/release.
pub fn shmtrace() -> PathBuf {
    if let Some(p) = std::env::var_os("SHMTRACE_BIN") {
        return PathBuf::from(p);
    }
    let p = root_dir().join("target/release/shmtrace");
    assert!(
        p.exists(),
        "{} is missing: run scripts/test.sh (it builds first)",
        p.display()
    );
    p
}

pub fn require_root() {
    assert!(
        nix_is_root(),
        "these tests load eBPF programs: run them as root (scripts/test.sh under sudo)"
    );
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A fresh scratch directory.
pub fn scratch(name: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "shmtrace-test-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Compiles tests/workloads/NAME.c (once per test binary run) and returns
/// the executable.
pub fn workload(name: &str) -> PathBuf {
    let src = root_dir().join("tests/workloads").join(format!("{name}.c"));
    let out_dir = root_dir().join("target/test-workloads");
    std::fs::create_dir_all(&out_dir).expect("workload dir");
    let exe = out_dir.join(name);
    let fresh = match (std::fs::metadata(&exe), std::fs::metadata(&src)) {
        (Ok(e), Ok(s)) => e.modified().ok() >= s.modified().ok(),
        _ => false,
    };
    if !fresh {
        // Build to a unique name and rename: tests compile in parallel.
        static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = out_dir.join(format!("{name}.{}.{n}.tmp", std::process::id()));
        let st = Command::new("gcc")
            .args(["-O1", "-Wall", "-Werror", "-o"])
            .arg(&tmp)
            .arg(&src)
            .arg("-ldl")
            .status()
            .expect("gcc");
        assert!(st.success(), "cannot compile {}", src.display());
        std::fs::rename(&tmp, &exe).expect("rename workload");
    }
    exe
}

/// Compiles tests/workloads/NAME.c as a shared library (for ctypes).
pub fn shared_lib(name: &str) -> PathBuf {
    let src = root_dir().join("tests/workloads").join(format!("{name}.c"));
    let out_dir = root_dir().join("target/test-workloads");
    std::fs::create_dir_all(&out_dir).expect("workload dir");
    let lib = out_dir.join(format!("lib{name}.so"));
    let tmp = out_dir.join(format!("lib{name}.{}.tmp", std::process::id()));
    let st = Command::new("gcc")
        .args(["-O1", "-Wall", "-Werror", "-shared", "-fPIC", "-o"])
        .arg(&tmp)
        .arg(&src)
        .status()
        .expect("gcc");
    assert!(st.success(), "cannot compile {}", src.display());
    std::fs::rename(&tmp, &lib).expect("rename library");
    lib
}

/// `unshare -m ... sh -c 'mount a SIZE tmpfs on /dev/shm && SCRIPT'`: a
/// private /dev/shm the way PLATFORM.md reproduces a container's.
pub fn private_shm(mount_opts: &str, script: &str) -> Vec<String> {
    in_private_ns(&format!(
        "mount -t tmpfs -o {mount_opts} tmpfs /dev/shm && {script}"
    ))
}

/// `unshare -m --propagation private sh -c SCRIPT`.
pub fn in_private_ns(script: &str) -> Vec<String> {
    [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
    ]
    .map(String::from)
    .to_vec()
}

/// What one `shmtrace run` gave.
pub struct Traced {
    pub output: Output,
    pub report: Value,
    pub events: Vec<Value>,
}

impl Traced {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }
    pub fn failures(&self) -> &Vec<Value> {
        self.report["failures"].as_array().expect("failures array")
    }
    pub fn first(&self) -> &Value {
        &self.report["first_failure"]
    }
}

/// `shmtrace run --report R --events E [extra] -- cmd`, under the shared
/// lock (see [`bpf_lock`]).
pub fn run_traced(extra: &[&str], cmd: &[String]) -> Traced {
    run_traced_env(&[], extra, cmd)
}

/// [`run_traced`] with `env` set for shmtrace.
pub fn run_traced_env(env: &[(&str, &str)], extra: &[&str], cmd: &[String]) -> Traced {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("run");
    let report = dir.join("report.json");
    let events = dir.join("events.jsonl");
    let output = Command::new(shmtrace())
        .envs(env.iter().copied())
        .arg("run")
        .arg("--report")
        .arg(&report)
        .arg("--events")
        .arg(&events)
        .args(extra)
        .arg("--")
        .args(cmd)
        .stdin(Stdio::null())
        .output()
        .expect("spawn shmtrace");
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!(
            "no report ({e}); shmtrace stderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let report = report_json(&text);
    let events = std::fs::read_to_string(&events)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("each event line is JSON"))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    Traced {
        output,
        report,
        events,
    }
}

/// Tests that run shmtrace hold this lock shared; the test that checks no
/// program stays loaded after exit holds it exclusive, so no other test's
/// programs are loaded while it looks.
pub struct BpfLock(#[allow(dead_code)] File);

pub fn bpf_lock(exclusive: bool) -> BpfLock {
    let path = std::env::temp_dir().join("shmtrace-tests.lock");
    let f = File::options()
        .create(true)
        .append(true)
        .open(path)
        .expect("lock file");
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    // SAFETY: flock on an fd we own.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), op) }, 0, "flock");
    BpfLock(f)
}

/// The workload's own account of what happened, parsed from its stdout
/// (the last line that is a JSON object).
pub fn truth(stdout: &str) -> Value {
    stdout
        .lines()
        .rev()
        .find_map(|l| l.find('{').and_then(|i| serde_json::from_str(&l[i..]).ok()))
        .unwrap_or_else(|| panic!("workload printed no JSON truth:\n{stdout}"))
}

pub fn pids(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|p| p.as_u64().expect("pid"))
        .collect()
}

/// Cleans up after a test even when it panics: creates the `finish` file
/// its workloads wait for, and interrupts the processes it started, so no
/// stray process outlives the test (nor holds the test runner's pipes).
pub struct Cleanup {
    pub finish: Option<PathBuf>,
    pub pids: Vec<u32>,
}

impl Cleanup {
    pub fn new(finish: Option<PathBuf>) -> Self {
        Self {
            finish,
            pids: Vec::new(),
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(f) = &self.finish {
            let _ = std::fs::write(f, "");
        }
        for &pid in &self.pids {
            // Only ours: the pid may have been reused since it exited.
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let ours = String::from_utf8_lossy(&cmd);
            if ours.contains("shmtrace") || ours.contains("test-workloads") {
                // SAFETY: plain kill(2).
                unsafe { libc::kill(pid as i32, libc::SIGINT) };
            }
        }
    }
}

/// Collects what `child` writes to its (piped) stderr, in the background.
pub struct Captured {
    text: std::sync::Arc<std::sync::Mutex<String>>,
    reader: std::thread::JoinHandle<()>,
}

impl Captured {
    pub fn stderr(child: &mut Child) -> Self {
        use std::io::BufRead;
        let pipe = child.stderr.take().expect("stderr piped");
        let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let into = text.clone();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut t = into.lock().unwrap();
                t.push_str(&line);
                t.push('\n');
            }
        });
        Self { text, reader }
    }

    /// Waits until a line `ok` accepts has come (fails after 20 s).
    pub fn until(&self, what: &str, ok: impl Fn(&str) -> bool) {
        let start = Instant::now();
        while !self.text.lock().unwrap().lines().any(&ok) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "never printed {what}: {}",
                self.text.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Everything, once the child has closed its stderr.
    pub fn all(self) -> String {
        let _ = self.reader.join();
        self.text.lock().unwrap().clone()
    }
}

/// Reads the periodic report until `ok` accepts it (or fails after 20 s).
pub fn report_until(path: &Path, what: &str, mut ok: impl FnMut(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(v) = serde_json::from_str::<Value>(&text)
            && ok(&v)
        {
            return report_json(&text);
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "report never showed {what}: {}",
            std::fs::read_to_string(path).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A shmtrace child that is killed when the test lets go of it, so a
/// failed assertion never leaves an agent attached (and holding the
/// suite's output pipe) after the test.
pub struct Agent(Option<Child>);

impl Agent {
    pub fn new(child: Child) -> Self {
        Self(Some(child))
    }

    /// The child, no longer killed on drop: for `wait_with_output`.
    pub fn into_child(mut self) -> Child {
        self.0
            .take()
            .expect("an agent holds its child until dropped")
    }
}

impl std::ops::Deref for Agent {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.0
            .as_ref()
            .expect("an agent holds its child until dropped")
    }
}

impl std::ops::DerefMut for Agent {
    fn deref_mut(&mut self) -> &mut Child {
        self.0
            .as_mut()
            .expect("an agent holds its child until dropped")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0
            && let Ok(None) = c.try_wait()
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Reads shmtrace's stderr up to its first line that is not a note (notes
/// such as the hooks' backend come first, and only on some kernels): that
/// line, with the notes before it.
pub fn first_status_line(r: &mut impl BufRead) -> (String, Vec<String>) {
    let mut notes = Vec::new();
    loop {
        let mut line = String::new();
        let read = r.read_line(&mut line).unwrap_or(0);
        if read == 0 || !line.starts_with("shmtrace: note:") {
            return (line, notes);
        }
        notes.push(line);
    }
}

/// `shmtrace --quiet EXTRA --report REPORT` node-wide, once it is tracing.
pub fn start_node_wide(extra: &[&str], report: &Path) -> Agent {
    start_node_wide_to(extra, report, Stdio::inherit())
}

/// [`start_node_wide`] with its stdout (incident log lines, `-o json`)
/// piped to the test.
pub fn start_node_wide_piped(extra: &[&str], report: &Path) -> Agent {
    start_node_wide_to(extra, report, Stdio::piped())
}

fn start_node_wide_to(extra: &[&str], report: &Path, stdout: Stdio) -> Agent {
    let mut tracer = Agent::new(
        Command::new(shmtrace())
            .arg("--quiet")
            .args(extra)
            .arg("--report")
            .arg(report)
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (line, notes) = first_status_line(&mut BufReader::new(tracer.stderr.as_mut().unwrap()));
    assert!(line.contains("tracing every process"), "{notes:?} {line}");
    tracer
}

/// GET `path` from the metrics port: the body.
pub fn http_get(port: u32, path: &str) -> String {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port as u16)).expect("metrics port");
    // In two pieces, as TCP may deliver it: the server must wait for the
    // whole request head.
    s.write_all(b"GET ").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    s.write_all(format!("{path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// What a report says about one run, without what differs from run to run
/// (pids, times, inode numbers, the exact bytes a killed writer got to,
/// what failing processes held):
/// two backends, or two runs, that saw the same failure tell the same story.
pub fn story(r: &Value) -> Value {
    let f = &r["first_failure"];
    let mut kinds: Vec<Value> = Vec::new();
    for x in r["failures"].as_array().into_iter().flatten() {
        let k = serde_json::json!([x["kind"], x["syscall"], x["errno"], x["path"]]);
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    let mut files: Vec<Value> = r["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["allocated_bytes"].as_u64() > Some(0))
        .map(|x| serde_json::json!([x["name"], x["unlinked"]]))
        .collect();
    files.sort_by_key(|v| v.to_string());
    files.dedup();
    // Holders that did not fail: what a failing writer holds (a failing
    // fallocate's pages before tmpfs frees them) depends on when the
    // holders were read.
    let failed: Vec<&Value> = r["failures"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| &x["pid"])
        .collect();
    let mut holders: Vec<String> = f["holders"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|h| !failed.contains(&&h["pid"]))
        .map(|h| h["comm"].as_str().unwrap_or_default().to_string())
        .collect();
    holders.sort();
    let d = &r["diagnosis"];
    serde_json::json!({
        "first": {
            "kind": f["kind"], "syscall": f["syscall"], "errno": f["errno"],
            "signal": f["signal"], "si_code": f["si_code"], "comm": f["comm"],
            "path": f["path"], "bytes": f["bytes"], "offset": f["offset"],
            "file_size": f["file_size"], "unlinked": f["unlinked"],
            "reason": f["reason"], "cause": masked(&f["cause"]),
            "mountpoint": f["mount"]["mountpoint"], "size": f["mount"]["size_bytes"],
            "container": f["container"]["pod_uid"],
        },
        "failures": kinds,
        "files": files,
        "holders": holders,
        "diagnosis": {
            "signature": d["signature"], "framework": d["framework"],
            "recommended": d["recommended_shm_bytes"], "summary": masked(&d["summary"]),
        },
    })
}

/// A report's sentence with every number in it as `#`, sizes as `# bytes`.
fn masked(v: &Value) -> Value {
    let Some(s) = v.as_str() else {
        return v.clone();
    };
    let mut out = String::new();
    let mut in_num = false;
    for c in s.chars() {
        let digit = c.is_ascii_digit() || (in_num && c == '.');
        if digit && !in_num {
            out.push('#');
        } else if !digit {
            out.push(c);
        }
        in_num = digit;
    }
    // And their units: a few pages more or less free at a failure's moment
    // turn "4.0 KiB" into "0 B".
    for unit in ["# GiB", "# MiB", "# KiB", "# B"] {
        out = out.replace(unit, "# bytes");
    }
    Value::String(out)
}
