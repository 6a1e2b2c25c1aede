//! The report's JSON, pinned: synthetic event streams of each failure kind
//! through state and analysis, serialized and compared with the files in
//! `golden/`. A refactor that changes a field's name, value or presence
//! fails here. After a deliberate change, regenerate with
//! `SHMTRACE_BLESS=1 cargo test -p shmtrace golden` and review the diff.

use crate::{
    analysis::{Report, facts::Context},
    event::{Addr, CudaCall, Event, ExitStatus, FailedCall, KernelLimits, Syscall},
    host::{Limits, fixture::Fixture, memcg::Memcg},
    state::{
        State,
        tests::{MIB, SHM, dataloader_events, enospc, file, setup},
    },
};

fn ctx() -> Context {
    Context {
        mode: "run",
        node: false,
        command: Some(vec!["python".into(), "train.py".into()]),
        target_pid: Some(10),
        duration_s: 2.5,
        counters: Default::default(),
        host_stalls: Default::default(),
        exit: None,
        notes: Vec::new(),
    }
}

fn check(name: &str, st: &State) {
    let report = Report::build(st, ctx());
    let got = serde_json::to_string_pretty(&report).unwrap() + "\n";
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/analysis/golden")
        .join(format!("{name}.json"));
    if std::env::var_os("SHMTRACE_BLESS").is_some() {
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (SHMTRACE_BLESS=1 writes it)", path.display()));
    if got != want {
        let line = got
            .lines()
            .zip(want.lines())
            .position(|(g, w)| g != w)
            .unwrap_or(got.lines().count().min(want.lines().count()));
        panic!(
            "{name}: the report differs from {} at line {}:\n  got:  {}\n  want: {}",
            path.display(),
            line + 1,
            got.lines().nth(line).unwrap_or("<end>"),
            want.lines().nth(line).unwrap_or("<end>"),
        );
    }
}

fn apply(st: &mut State, host: &mut Fixture, evs: &[Event]) {
    for ev in evs {
        st.apply(ev, host);
    }
    st.tick(host);
}

/// A DataLoader whose worker 13 faults first, then 11; both die.
fn dataloader_sigbus() -> State {
    let (mut st, mut host, mut s) = setup();
    host.cmdlines.insert(10, "python train.py".into());
    st.add_existing(&mut host, 10, 0, true);
    let mut evs = dataloader_events(&mut s, "torch");
    // A SIGBUS a process sends is no failure; it is kept aside.
    evs.push(Event::Sigbus {
        h: s.h(12, 10),
        target: 12,
        target_tid: 12,
        si_code: 0,
        si_errno: 0,
        addr: Addr(0),
        mount: None,
    });
    for w in [13, 11] {
        evs.push(Event::Exit {
            h: s.h(w, 10),
            status: ExitStatus::from_kernel(7),
        });
    }
    apply(&mut st, &mut host, &evs);
    st
}

/// PyTorch 2.x: fallocate ENOSPC in a worker, then in the main process.
fn fallocate_enospc() -> State {
    let (mut st, mut host, mut s) = setup();
    st.add_existing(&mut host, 10, 0, true);
    let fork = s.h(10, 1);
    let mut worker = s.h(11, 10);
    worker.comm = "pt_data_worker".into();
    let main = s.h(10, 1);
    let evs = vec![
        Event::Fork { h: fork, child: 11 },
        enospc(
            worker,
            Syscall::Fallocate,
            5,
            32 * MIB,
            file(100, "torch_11_1", 0, 0, 8192),
        ),
        enospc(
            main,
            Syscall::Write,
            6,
            512 * 1024,
            file(101, "fill", 0, 0, 16384),
        ),
    ];
    apply(&mut st, &mut host, &evs);
    st
}

/// Calls that fail for other reasons than a full /dev/shm: an mmap past
/// RLIMIT_AS, an open at the inode limit, a file-size limit.
fn other_causes() -> State {
    let (mut st, mut host, mut s) = setup();
    host.dirs.insert(21, "/dev/shm".into());
    host.usage.get_mut(&SHM).unwrap().inodes_used = 1000;
    host.limits.insert(
        20,
        Limits {
            address_space: Some(256 * MIB),
            vm_bytes: Some(250 * MIB),
            ..Default::default()
        },
    );
    let mmap = Event::SyscallFailed {
        h: s.h(20, 1),
        limits: Some(KernelLimits {
            address_space: Some(256 * MIB),
            vm_bytes: 250 * MIB,
            map_count: 40,
            ..Default::default()
        }),
        mnt_flags: 0,
        errno: libc::ENOMEM,
        call: FailedCall::OnFile {
            syscall: Syscall::Mmap,
            fd: 4,
            offset: Some(0),
            bytes: Some(16 * MIB),
            prot: Some(3),
            mountpoint: None,
            file: file(200, "seg", 16 * MIB as i64, 0, 100),
        },
    };
    let open = Event::SyscallFailed {
        h: s.h(21, 1),
        limits: None,
        mnt_flags: 0,
        errno: libc::ENOSPC,
        call: FailedCall::Open {
            syscall: Syscall::Openat,
            dirfd: None,
            path: "sem.lock".into(),
        },
    };
    let efbig = Event::SyscallFailed {
        h: s.h(22, 1),
        limits: Some(KernelLimits {
            file_size: Some(MIB),
            ..Default::default()
        }),
        mnt_flags: 0,
        errno: libc::EFBIG,
        call: FailedCall::OnFile {
            syscall: Syscall::Write,
            fd: 3,
            offset: Some(MIB),
            bytes: Some(4096),
            prot: None,
            mountpoint: None,
            file: file(201, "log", MIB as i64, MIB, 300),
        },
    };
    apply(&mut st, &mut host, &[mmap, open, efbig]);
    st
}

/// The OOM killer takes a shm writer whose pod holds the memory limit (its
/// container's own cgroup has none), after it filled a named /dev/shm file;
/// another container of the pod holds a smaller one. A CUDA IPC call fails
/// elsewhere.
fn oom_and_cuda() -> State {
    let (mut st, mut host, mut s) = setup();
    let pod = "/kubepods/burstable/podabc";
    let (own, sidecar) = (format!("{pod}/0123"), format!("{pod}/0456"));
    host.memcgs.insert(51, (2, own.clone()));
    host.memcgs.insert(52, (2, sidecar));
    host.memcg_stats.insert(
        (2, own.clone()),
        Memcg {
            version: 2,
            path: own,
            limit_bytes: Some(48 * MIB),
            usage_bytes: 48 * MIB,
            shmem_bytes: Some(46 * MIB),
            own_limit_bytes: None,
            limit_path: Some(pod.into()),
            limit_raw: Some(pod.into()),
            oom_kills: Some(1),
            max_events: Some(7),
            ..Default::default()
        },
    );
    host.oom_lines.insert(
        51,
        crate::host::kmsg::OomLine {
            constraint: "CONSTRAINT_MEMCG".into(),
            oom_memcg: Some(pod.into()),
            task_memcg: Some(format!("{pod}/0123")),
            task: "worker_51".into(),
            pid: 51,
        },
    );
    let create = |s: &mut crate::state::tests::Stream, pid, ino, name: &str, bytes: u64| {
        let f = file(ino, name, bytes as i64, bytes, 12288);
        vec![
            Event::Opened {
                h: s.h(pid, 50),
                syscall: Syscall::Openat,
                fd: Some(3),
                flags: libc::O_CREAT as u64,
                file: file(ino, name, 0, 0, 0),
            },
            Event::Truncated {
                h: s.h(pid, 50),
                fd: 3,
                length: bytes,
                file: f,
            },
        ]
    };
    let mut evs = vec![
        Event::Fork {
            h: s.h(50, 1),
            child: 51,
        },
        Event::Fork {
            h: s.h(50, 1),
            child: 52,
        },
    ];
    evs.extend(create(&mut s, 52, 71, "cache", 2 * MIB));
    evs.extend(create(&mut s, 51, 70, "big", 46 * MIB));
    // Their fds as /proc lists them (the victim's go with it).
    for (pid, ino, bytes) in [(52, 71, 2 * MIB), (51, 70, 46 * MIB)] {
        host.file(SHM, ino, bytes as i64, bytes, 1);
        host.open_fd(pid, 3, SHM, ino);
    }
    evs.extend([
        Event::OomVictim {
            h: s.h(99, 1),
            victim: 51,
            shmem_rss: 40 * MIB,
        },
        Event::Exit {
            h: s.h(51, 50),
            status: ExitStatus::from_kernel(9),
        },
        Event::CudaIpcFailed {
            h: s.h(60, 1),
            call: CudaCall::GetMemHandle,
            code: 2,
        },
    ]);
    apply(&mut st, &mut host, &evs);
    st
}

/// A segment removed by a cleanup job, then opened: found gone.
fn segment_gone() -> State {
    let (mut st, mut host, mut s) = setup();
    let mut rm = s.h(77, 1);
    rm.comm = "rm".into();
    let unlink = Event::Unlinked {
        h: rm,
        path: "/dev/shm/psm_1".into(),
        dirfd: None,
        dir_dev: None,
    };
    let open = Event::SyscallFailed {
        h: s.h(20, 1),
        limits: None,
        mnt_flags: 0,
        errno: libc::ENOENT,
        call: FailedCall::Open {
            syscall: Syscall::Openat,
            dirfd: None,
            path: "/dev/shm/psm_1".into(),
        },
    };
    let at = open.header().ts_ns;
    apply(&mut st, &mut host, &[unlink, open]);
    st.settle(&mut host, at + crate::state::missing::MISSING_GRACE_NS);
    st
}

#[test]
fn golden_dataloader_sigbus() {
    check("dataloader_sigbus", &dataloader_sigbus());
}

#[test]
fn golden_fallocate_enospc() {
    check("fallocate_enospc", &fallocate_enospc());
}

#[test]
fn golden_other_causes() {
    check("other_causes", &other_causes());
}

#[test]
fn golden_oom_and_cuda() {
    check("oom_and_cuda", &oom_and_cuda());
}

#[test]
fn golden_segment_gone() {
    check("segment_gone", &segment_gone());
}

/// The closing summary of each: what a person reads first.
fn summary(st: &State) -> String {
    crate::output::summary::render(&Report::build(st, ctx()))
}

#[test]
fn the_summary_leads_with_the_first_worker_and_the_fix() {
    let text = summary(&dataloader_sigbus());
    let first = text
        .lines()
        .find(|l| l.trim_start().starts_with("first failure"))
        .unwrap();
    assert!(first.contains("pid 13 (worker_13)"), "{text}");
    assert!(
        text.contains("why            the tmpfs had no free page for this write (full)"),
        "{text}"
    );
    assert!(text.contains("docker run --shm-size=128m"), "{text}");
    // The collateral worker is listed after it, with its delay.
    assert!(text.contains("1 later failure"), "{text}");
    assert!(text.contains("pid 11 (worker_11)"), "{text}");
}

#[test]
fn the_summary_of_a_cause_other_than_a_full_mount_gives_its_fix_not_a_size() {
    let text = summary(&other_causes());
    assert!(
        text.contains("RLIMIT_AS (ulimit -v) of 256.0 MiB"),
        "{text}"
    );
    assert!(text.contains("ulimit -v unlimited"), "{text}");
    assert!(!text.contains("--shm-size"), "{text}");
}

#[test]
fn the_summary_of_an_oom_kill_names_the_limit() {
    let text = summary(&oom_and_cuda());
    assert!(text.contains("killed by the OOM killer"), "{text}");
    assert!(text.contains("allows 48.0 MiB"), "{text}");
    assert!(!text.contains("--shm-size"), "{text}");
}

#[test]
fn reports_are_the_same_whatever_the_order_files_were_seen_in() {
    // Files are listed by (dev, ino), not in hash order: two builds agree.
    let a = serde_json::to_string(&Report::build(&dataloader_sigbus(), ctx())).unwrap();
    let b = serde_json::to_string(&Report::build(&dataloader_sigbus(), ctx())).unwrap();
    assert_eq!(a, b);
}
