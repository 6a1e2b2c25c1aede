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
    event::{Event, ExitStatus, FailedCall, Handler, Syscall},
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
    let dir = scratch("sys-exit");
    let mnt = dir.join("shm");
    std::fs::create_dir_all(&mnt).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs");
    let result = std::panic::catch_unwind(|| {
        // Writes, opens, mmap, munmap, mremap, ftruncate: 17 syscalls.
        with_programs(&["sys_exit_files"], 17, |t| {
            // Another process: shmtrace never traces its own.
            let file = mnt.join("seg\nment");
            let mut child = waiting_shell(&format!(
                "exec fallocate -l 1M \"$(printf '{}/seg\\nment')\"",
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
            let failed = evs.into_iter().find(is_failure).unwrap();
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
    let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
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

#[test]
fn sys_exit_close_reports_closes_of_the_tmpfs_files_a_process_created() {
    let dir = scratch("sys-exit-close");
    let mnt = dir.join("shm");
    std::fs::create_dir_all(&mnt).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs");
    let result = std::panic::catch_unwind(|| {
        // sys_exit_files sees the creation (and marks the process a
        // holder); sys_exit_close only reports fds it knows.
        with_programs(&["sys_exit_files", "sys_exit_close"], 18, |t| {
            let script = format!(
                "import os\nfd = os.open('{}/seg', os.O_CREAT | os.O_RDWR)\nprint(fd, flush=True)\n\
                 os.close(os.open('/proc/self/stat', os.O_RDONLY))\nos.close(fd)",
                mnt.display()
            );
            let mut child = waiting_shell(&format!("exec /usr/bin/python3 -c \"{script}\""));
            let pid = child.id();
            t.trace(pid, traced::REPORT).unwrap();
            go(&mut child);
            assert!(child.wait().unwrap().success());
            let ours = |e: &Event| e.header().pid == pid;
            let evs = collect(t, "open and close of the tmpfs file", |evs| {
                evs.iter()
                    .any(|e| ours(e) && matches!(e, Event::Closed { .. }))
            });
            let fd = evs
                .iter()
                .find_map(|e| match e {
                    Event::Opened { h, fd, .. } if h.pid == pid => Some(*fd),
                    _ => None,
                })
                .expect("the creation is reported");
            let closed: Vec<i32> = evs
                .iter()
                .filter_map(|e| match e {
                    Event::Closed { h, fd } if h.pid == pid => Some(*fd),
                    _ => None,
                })
                .collect();
            // Only the tmpfs fd: the close of /proc/self/stat is not one.
            assert_eq!(closed, vec![fd]);
        })
    });
    let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
