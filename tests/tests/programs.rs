//! One test per eBPF program, in the style of aya's integration tests:
//! load that program alone into this kernel, trigger its hook with a real
//! process, and assert on the typed record it sends.

use std::{
    io::Write,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use shmtrace::{
    capture::Tracer,
    event::{CudaCall, Event, ExitStatus, FailedCall, Handler, Syscall},
};
use shmtrace_common::traced;
use shmtrace_tests::{bpf_lock, require_root, scratch, workload};

/// Loads only `program`, runs `f` with it, and keeps a runtime for its rings.
fn with_program<T>(program: &str, f: impl FnOnce(&mut Tracer) -> T) -> T {
    with_programs(&[program], 1, f)
}

/// Loads only `programs` (attached to `hooks` hook points in all), runs `f`.
fn with_programs<T>(programs: &[&str], hooks: usize, f: impl FnOnce(&mut Tracer) -> T) -> T {
    require_root();
    let _lock = bpf_lock(false);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let mut t = Tracer::start_with(false, None, |p| programs.contains(&p))
        .unwrap_or_else(|e| panic!("loading {programs:?}: {e:#}"));
    assert_eq!(
        t.hooks.len(),
        hooks,
        "only {programs:?} are attached: {:?}",
        t.hooks
    );
    for h in &t.hooks {
        assert!(h.1.is_none(), "{programs:?}: {h:?}");
    }
    f(&mut t)
}

/// Drains until `want` matches a record or 10 s pass.
fn wait_for(t: &mut Tracer, what: &str, want: impl Fn(&Event) -> bool) -> Event {
    let all = collect(t, what, |evs| evs.iter().any(&want));
    all.into_iter().find(want).expect("collected")
}

/// Every record drained until `done` says so (or 10 s pass).
fn collect(t: &mut Tracer, what: &str, done: impl Fn(&[Event]) -> bool) -> Vec<Event> {
    let start = Instant::now();
    let mut seen = Vec::new();
    loop {
        seen.extend(t.drain(true));
        if done(&seen) {
            return seen;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no {what} record; saw {:?}",
            seen.iter().map(Event::name).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A shell waiting for a line on stdin, then running `then`.
fn waiting_shell(then: &str) -> Child {
    Command::new("sh")
        .args(["-c", &format!("read x; {then}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

fn go(child: &mut Child) {
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
}

#[test]
fn sched_process_fork_reports_children_and_follows_them() {
    with_program("sched_process_fork", |t| {
        let me = std::process::id();
        t.trace(me, traced::REPORT | traced::FOLLOW).unwrap();
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let ev = wait_for(
            t,
            "fork",
            |e| matches!(e, Event::Fork { child, .. } if *child == pid),
        );
        assert_eq!(ev.header().pid, me);
        t.untrace(me);
    });
}

#[test]
fn sched_process_exec_reports_the_file_name() {
    with_program("sched_process_exec", |t| {
        let mut child = waiting_shell("exec /bin/true");
        let pid = child.id();
        t.trace(pid, traced::REPORT).unwrap();
        go(&mut child);
        child.wait().unwrap();
        // The shell's own exec may come first: traced from the spawn on.
        let ev = wait_for(
            t,
            "exec",
            |e| matches!(e, Event::Exec { h, filename, .. } if h.pid == pid && filename == "/bin/true"),
        );
        let Event::Exec {
            filename, old_pid, ..
        } = ev
        else {
            panic!("{ev:?}")
        };
        assert_eq!((filename.as_str(), old_pid), ("/bin/true", pid));
    });
}

#[test]
fn sched_process_exit_reports_the_status() {
    with_program("sched_process_exit", |t| {
        let mut child = waiting_shell("exit 3");
        let pid = child.id();
        t.trace(pid, traced::REPORT).unwrap();
        go(&mut child);
        child.wait().unwrap();
        let ev = wait_for(t, "exit", |e| e.header().pid == pid);
        let Event::Exit { status, .. } = ev else {
            panic!("{ev:?}")
        };
        assert_eq!(
            status,
            ExitStatus {
                code: Some(3),
                signal: None,
                core_dumped: false
            }
        );
    });
}

/// kill(pid, SIGBUS) from this process: a SIGBUS sent, not a fault.
fn sigbus_a_sleeper(t: &mut Tracer) -> u32 {
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    t.trace(pid, traced::REPORT).unwrap();
    // SAFETY: plain kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGBUS) }, 0);
    child.wait().unwrap();
    pid
}

#[test]
fn signal_generate_reports_sender_target_and_si_code() {
    with_program("signal_generate", |t| {
        let pid = sigbus_a_sleeper(t);
        let ev = wait_for(
            t,
            "signal_generate",
            |e| matches!(e, Event::Sigbus { target, .. } if *target == pid),
        );
        let Event::Sigbus { h, si_code, .. } = ev else {
            panic!()
        };
        assert_eq!(h.pid, std::process::id(), "the header is the sender");
        assert_eq!(si_code, 0, "SI_USER: sent by kill(2)");
    });
}

#[test]
fn signal_deliver_reports_the_default_action() {
    with_program("signal_deliver", |t| {
        let pid = sigbus_a_sleeper(t);
        let ev = wait_for(t, "signal_deliver", |e| e.header().pid == pid);
        let Event::SigbusDelivered {
            handler, si_code, ..
        } = ev
        else {
            panic!("{ev:?}")
        };
        assert_eq!((handler, si_code), (Handler::Default, 0));
    });
}

#[test]
fn syscall_exits_report_tmpfs_creation_and_enospc() {
    with_tmpfs("sys-exit", "64k", |mnt| {
        // Writes, opens, mmap, munmap, mremap, ftruncate: 17 syscalls.
        with_programs(&["sys_exit_files"], 16, |t| {
            // Another process: shmtrace never traces its own.
            let file = mnt.join("seg\nment");
            // In a memory cgroup of its own (v1, as on this machine), whose
            // id is its directory's inode.
            let cg = format!(
                "/sys/fs/cgroup/memory/shmtrace-programs-{}",
                std::process::id()
            );
            std::fs::create_dir_all(&cg).expect("a v1 memory cgroup");
            let memcg = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&cg).unwrap());
            let mut child = waiting_shell(&format!(
                "echo $$ > {cg}/cgroup.procs && exec fallocate -l 1M \"$(printf '{}/seg\\nment')\"",
                mnt.display()
            ));
            let pid = child.id();
            t.trace(pid, traced::REPORT).unwrap();
            go(&mut child);
            assert!(
                !child.wait().unwrap().success(),
                "fallocate fails: 64 KiB tmpfs"
            );
            assert!(file.exists());
            let is_open = |e: &Event| matches!(e, Event::Opened { .. }) && e.header().pid == pid;
            let is_failure =
                |e: &Event| matches!(e, Event::SyscallFailed { .. }) && e.header().pid == pid;
            let evs = collect(t, "open and fallocate failure", |evs| {
                evs.iter().any(is_open) && evs.iter().any(is_failure)
            });
            let opened = evs.iter().find(|e| is_open(e)).unwrap();
            assert_eq!(opened.file().unwrap().name.as_deref(), Some("seg\\x0ament"));
            // Both name the memory cgroup the kernel charges it to.
            let _ = std::fs::remove_dir(&cg);
            assert_eq!(opened.header().memcg_id, memcg);
            let failed = evs.into_iter().find(is_failure).unwrap();
            assert_eq!(failed.header().memcg_id, memcg);
            let Event::SyscallFailed { errno, call, .. } = failed else {
                panic!()
            };
            assert_eq!(errno, libc::ENOSPC);
            let FailedCall::OnFile {
                syscall,
                bytes,
                offset,
                file,
                ..
            } = call
            else {
                panic!("{call:?}")
            };
            assert_eq!(
                (syscall, bytes, offset),
                (Syscall::Fallocate, Some(1 << 20), Some(0))
            );
            assert_eq!(file.mount.max_pages, 16, "64 KiB of 4 KiB pages");
        })
    });
}

#[test]
fn oom_mark_victim_reports_the_victim_and_its_shmem() {
    let exe = workload("oom_shm");
    let cg = format!(
        "/sys/fs/cgroup/memory/shmtrace-test-prog-oom-{}",
        std::process::id()
    );
    std::fs::create_dir_all(&cg).expect("memory cgroup (v1 memory controller)");
    std::fs::write(format!("{cg}/memory.limit_in_bytes"), "32M").unwrap();
    with_program("oom_mark_victim", |t| {
        let mut child = waiting_shell(&format!(
            "echo $$ > {cg}/cgroup.procs && exec {}",
            exe.display()
        ));
        let pid = child.id();
        t.trace(pid, traced::REPORT).unwrap();
        go(&mut child);
        child.wait().unwrap();
        let ev = wait_for(t, "oom victim", |e| matches!(e, Event::OomVictim { .. }));
        let Event::OomVictim {
            victim, shmem_rss, ..
        } = ev
        else {
            panic!()
        };
        assert_eq!(victim, pid);
        assert!(shmem_rss > 16 << 20, "{shmem_rss}");
    });
    let _ = std::fs::remove_dir(&cg);
}

/// A private tmpfs at `dir/shm` for `f`, unmounted after it (even on failure).
fn with_tmpfs(name: &str, size: &str, f: impl FnOnce(&std::path::Path) + std::panic::UnwindSafe) {
    let dir = scratch(name);
    let mnt = dir.join("shm");
    std::fs::create_dir_all(&mnt).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs");
    let m = mnt.clone();
    let result = std::panic::catch_unwind(move || f(&m));
    let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn sys_exit_unlink_reports_removals_of_dev_shm_names_from_any_process() {
    // unlink and unlinkat.
    with_programs(&["sys_exit_unlink"], 2, |t| {
        // Untraced on purpose: a cleanup job's removal must be seen.
        let name = format!("/dev/shm/shmtrace-prog-unlink-{}", std::process::id());
        std::fs::write(&name, b"x").unwrap();
        let other = scratch("prog-unlink").join("not-shm");
        std::fs::write(&other, b"x").unwrap();
        let mut child = waiting_shell(&format!("exec rm -f {} {name}", other.display()));
        let pid = child.id();
        go(&mut child);
        assert!(child.wait().unwrap().success());
        let evs = collect(t, "unlink", |evs| {
            evs.iter()
                .any(|e| matches!(e, Event::Unlinked { h, .. } if h.pid == pid))
        });
        let paths: Vec<&str> = evs
            .iter()
            .filter_map(|e| match e {
                Event::Unlinked { h, path, .. } if h.pid == pid => Some(path.as_str()),
                _ => None,
            })
            .collect();
        // Only the /dev/shm name: the other file is not shared memory.
        assert_eq!(paths, vec![name.as_str()]);
        let _ = std::fs::remove_dir_all(scratch("prog-unlink"));
    });
}

#[test]
fn sys_exit_recv_reports_control_data_of_traced_processes() {
    with_program("sys_exit_recv", |t| {
        // Python passes an fd over a socketpair to itself (SCM_RIGHTS).
        let script = "import socket, os\n\
             a, b = socket.socketpair(socket.AF_UNIX)\n\
             r, w = os.pipe()\n\
             socket.send_fds(a, [b'x'], [r])\n\
             msg, fds, flags, addr = socket.recv_fds(b, 1, 1)\n\
             assert len(fds) == 1\n\
             a.send(b'plain')\n\
             b.recvmsg(16)";
        let mut child = waiting_shell(&format!("exec /usr/bin/python3 -c \"{script}\""));
        let pid = child.id();
        t.trace(pid, traced::REPORT).unwrap();
        go(&mut child);
        assert!(child.wait().unwrap().success());
        let evs = collect(t, "recvmsg with fds", |evs| {
            evs.iter()
                .any(|e| matches!(e, Event::FdsReceived { h, .. } if h.pid == pid))
        });
        let got: Vec<u64> = evs
            .iter()
            .filter_map(|e| match e {
                Event::FdsReceived { h, control_bytes } if h.pid == pid => Some(*control_bytes),
                _ => None,
            })
            .collect();
        // One record: the message with an fd; the plain one carries none.
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0] >= 16, "a cmsg with one fd: {got:?}");
    });
}

/// The CUDA IPC uretprobes on the real CUDA runtime PyPI's PyTorch ships:
/// without a GPU each call returns a real error code, captured as is. (The
/// driver's cuIpc* probes need libcuda, which only a GPU node's driver
/// installs: `scripts/gpu-check.sh` covers them there.)
#[test]
fn cuda_ipc_uretprobes_report_the_runtime_calls_error_codes() {
    let venv = "/var/cache/shmtrace/torch-venv";
    let lib = std::fs::read_dir(format!("{venv}/lib"))
        .expect("PyPI PyTorch venv missing: run scripts/setup.sh --test")
        .flatten()
        .flat_map(|py| {
            std::fs::read_dir(py.path().join("site-packages/nvidia"))
                .into_iter()
                .flatten()
                .flatten()
        })
        .flat_map(|cu| {
            std::fs::read_dir(cu.path().join("lib"))
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libcudart.so"))
        })
        .expect("libcudart in the venv");
    with_programs(&["cuda"], 0, |t| {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(&lib).unwrap();
        let name = lib.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            t.attach_cuda(&lib, &name, (md.dev(), md.ino())).unwrap(),
            "attached to {}",
            lib.display()
        );
        let script = format!(
            "import ctypes\nc = ctypes.CDLL('{}')\nh = ctypes.create_string_buffer(64)\n\
             print(c.cudaIpcGetMemHandle(h, ctypes.c_void_p(0)), \
             c.cudaIpcOpenMemHandle(ctypes.byref(ctypes.c_void_p()), h, 1), flush=True)",
            lib.display()
        );
        let mut child = Command::new(format!("{venv}/bin/python"))
            .args(["-c", &format!("import sys; sys.stdin.readline()\n{script}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        t.trace(pid, traced::REPORT).unwrap();
        go(&mut child);
        let out = child.wait_with_output().unwrap();
        let codes: Vec<i32> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(|c| c.parse().unwrap())
            .collect();
        assert_eq!(codes.len(), 2, "{out:?}");
        assert!(codes.iter().all(|&c| c != 0), "no GPU: both fail {codes:?}");
        let ours = |e: &Event| matches!(e, Event::CudaIpcFailed { h, .. } if h.pid == pid);
        let evs = collect(t, "two CUDA IPC errors", |evs| {
            evs.iter().filter(|e| ours(e)).count() >= 2
        });
        let got: Vec<(CudaCall, i32)> = evs
            .iter()
            .filter_map(|e| match e {
                Event::CudaIpcFailed { h, call, code } if h.pid == pid => Some((*call, *code)),
                _ => None,
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (CudaCall::GetMemHandle, codes[0]),
                (CudaCall::OpenMemHandle, codes[1])
            ]
        );
    });
}
