//! Files already in /dev/shm when tracing began: shmtrace never saw them
//! made, yet at a failure it lists them (read through the namespace, no
//! link followed), with their bytes and the command that removes them.

use std::process::Command;

use shmtrace_tests::*;

#[test]
fn files_made_before_tracing_began_are_listed_at_the_failure() {
    require_root();
    let _lock = bpf_lock(false);
    let dir = scratch("preexisting");
    let report = dir.join("report.json");
    // The old file is made before shmtrace starts, in the same private
    // /dev/shm; then the traced job fills the rest.
    let script = format!(
        "mount -t tmpfs -o size=8m tmpfs /dev/shm && \
         dd if=/dev/zero of=/dev/shm/old_job bs=1M count=5 2>/dev/null && \
         exec {} run --report {} -- dd if=/dev/zero of=/dev/shm/job bs=1M count=6",
        shmtrace().display(),
        report.display()
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let r = read_report(&report);
    let _ = std::fs::remove_dir_all(&dir);
    let f = &r["first_failure"];
    assert_eq!(f["path"], "/dev/shm/job", "{stderr}");
    assert_eq!(f["stray_count"], 1, "{f}");
    assert_eq!(f["stray_bytes"].as_u64(), Some(5 << 20));
    assert_eq!(f["strays"][0]["name"], "old_job");
    // The job's own file is no stray.
    assert!(
        !f["strays"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["name"] == "job")
    );
    let d = &r["diagnosis"];
    let o = d["strays"].as_str().unwrap();
    assert!(o.contains("/dev/shm/old_job (5.0 MiB)"), "{o}");
    assert!(o.contains("rm -- /dev/shm/old_job"), "{o}");
    assert!(stderr.contains("other files"), "{stderr}");
}
