//! The way kernels before 5.15 give a syscall's arguments (read from the
//! task's kernel stack, one program per syscall family: no
//! bpf_task_pt_regs there), forced on this machine's kernel with
//! SHMTRACE_SYSCALL_ARGS=stack: each failure it reports is the one the
//! default programs report, field for field. The VM tests (vm.rs) run it on
//! Debian 11's 5.10, where it is the only way.

use serde_json::Value;
use shmtrace_tests::*;

const STACK: &[(&str, &str)] = &[("SHMTRACE_SYSCALL_ARGS", "stack")];

/// The fields of a first failure that come from the syscall's arguments.
fn essentials(f: &Value) -> Value {
    serde_json::json!({
        "kind": f["kind"], "syscall": f["syscall"], "errno": f["errno"],
        "path": f["path"], "bytes": f["bytes"], "offset": f["offset"],
        "file_size": f["file_size"], "mountpoint": f["mount"]["mountpoint"],
        "size": f["mount"]["size_bytes"], "reason": f["reason"],
    })
}

fn both(opts: &str, script: &str) -> (Traced, Traced) {
    let cmd = private_shm(opts, script);
    let tp = run_traced(&[], &cmd);
    let stack = run_traced_env(STACK, &[], &cmd);
    assert!(
        stack
            .stderr()
            .contains("syscall arguments read from each task's kernel stack"),
        "the stack variant was not chosen:\n{}",
        stack.stderr()
    );
    (tp, stack)
}

#[test]
fn stack_read_arguments_match_on_every_failing_syscall() {
    let order = workload("order");
    for mode in ["write", "pwrite", "fallocate", "sigbus"] {
        let script = format!("exec {} {mode} /dev/shm 4 2 4194304", order.display());
        let (tp, stack) = both("size=8m", &script);
        for t in [&tp, &stack] {
            let truth = truth(&t.stdout());
            assert_eq!(
                t.first()["pid"].as_u64(),
                Some(pids(&truth["order"])[0]),
                "{mode}: first failing worker\n{}",
                t.stderr()
            );
        }
        let (a, b) = (essentials(tp.first()), essentials(stack.first()));
        assert_eq!(a, b, "{mode}: the two variants disagree");
        assert!(!a["syscall"].is_null() || mode == "sigbus", "{mode}: {a}");
    }
    let (tp, stack) = both(
        "size=8m,nr_inodes=8",
        &format!("exec {}", workload("inodes").display()),
    );
    assert_eq!(tp.first()["syscall"], "openat");
    assert_eq!(essentials(tp.first()), essentials(stack.first()), "inodes");
    let (tp, stack) = both(
        "size=8m",
        &format!("NO_LINGER=1 exec {}", workload("mmap_error").display()),
    );
    assert_eq!(tp.first()["syscall"], "mmap");
    assert_eq!(tp.first()["bytes"].as_u64(), Some(1 << 30));
    assert_eq!(essentials(tp.first()), essentials(stack.first()), "mmap");
}

#[test]
fn stack_read_arguments_attribute_created_and_mapped_files() {
    // Python's shared_memory: shm_open (openat O_CREAT), ftruncate, mmap,
    // then a fault past the mount's size: holders come from the open and
    // mmap records, the file's size from ftruncate.
    let dir = scratch("stackpy");
    let script = dir.join("shm.py");
    std::fs::write(
        &script,
        "from multiprocessing import shared_memory as s\n\
         m = s.SharedMemory(create=True, size=16 << 20)\n\
         m.buf[:] = b'x' * (16 << 20)\n",
    )
    .unwrap();
    let (tp, stack) = both(
        "size=4m",
        &format!("exec /usr/bin/python3 {}", script.display()),
    );
    for t in [&tp, &stack] {
        let f = t.first();
        assert_eq!(f["kind"], "sigbus", "{}", t.stderr());
        assert!(
            f["path"].as_str().unwrap().starts_with("/dev/shm/psm_"),
            "{f}"
        );
        assert_eq!(f["file_size"].as_u64(), Some(16 << 20), "{f}");
    }
}
