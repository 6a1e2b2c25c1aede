//! What is not a shared-memory failure must not be reported as one.

use std::process::Command;

use shmtrace_tests::*;

/// An 8 MiB ext4 image mounted (loop) in the command's private namespace.
fn on_small_ext4(script: &str) -> (Vec<String>, std::path::PathBuf) {
    let dir = scratch("ext4");
    let img = dir.join("fs.img");
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    assert!(
        Command::new("truncate")
            .arg("-s")
            .arg("8M")
            .arg(&img)
            .status()
            .unwrap()
            .success()
    );
    assert!(
        Command::new("mkfs.ext4")
            .arg("-q")
            .arg("-F")
            .arg(&img)
            .status()
            .unwrap()
            .success()
    );
    let cmd = in_private_ns(&format!(
        "mount -o loop {} {} && {}",
        img.display(),
        mnt.display(),
        script.replace("MNT", &mnt.display().to_string())
    ));
    (cmd, dir)
}

#[test]
fn enospc_on_a_non_tmpfs_filesystem_is_not_a_shm_failure() {
    let order = workload("order");
    for mode in ["fallocate", "write"] {
        let (cmd, dir) = on_small_ext4(&format!("{} {mode} MNT 2 1 4194304", order.display()));
        let t = run_traced(&[], &cmd);
        let _ = std::fs::remove_dir_all(dir);
        // The workload really did run out of space...
        assert!(
            t.stderr().contains("No space left on device"),
            "{mode}: {}",
            t.stderr()
        );
        // ...but not on tmpfs.
        assert_eq!(t.failures().len(), 0, "{mode}: {}", t.report["failures"]);
        assert!(t.first().is_null());
    }
}

#[test]
fn sigbus_from_a_truncated_non_tmpfs_mapping_is_not_a_shm_failure() {
    let exe = workload("truncate_sigbus");
    let dir = scratch("trunc");
    let t = run_traced(&[], &[exe.display().to_string(), dir.display().to_string()]);
    let _ = std::fs::remove_dir_all(dir);
    let pid = truth(&t.stdout())["pid"].as_u64().unwrap();
    assert_eq!(t.output.status.code(), Some(128 + 7), "it died of SIGBUS");
    assert_eq!(t.failures().len(), 0, "{}", t.report["failures"]);
    let others = t.report["other_sigbus"].as_array().unwrap();
    assert!(
        others.iter().any(|o| o["pid"].as_u64() == Some(pid)
            && o["reason"]
                .as_str()
                .unwrap()
                .contains("not in a tmpfs mapping")),
        "{others:?}"
    );
}

#[test]
fn sigbus_past_the_end_of_a_tmpfs_file_is_not_a_full_tmpfs() {
    let exe = workload("truncate_sigbus");
    let t = run_traced(
        &[],
        &private_shm("size=8m", &format!("exec {} /dev/shm", exe.display())),
    );
    let pid = truth(&t.stdout())["pid"].as_u64().unwrap();
    assert_eq!(t.output.status.code(), Some(128 + 7));
    assert_eq!(t.failures().len(), 0, "{}", t.report["failures"]);
    let others = t.report["other_sigbus"].as_array().unwrap();
    assert!(
        others.iter().any(|o| o["pid"].as_u64() == Some(pid)
            && o["reason"].as_str().unwrap().contains("beyond the end")),
        "{others:?}"
    );
}
