//! State driven by short synthetic event streams and a fixture host: no
//! root, no kernel, no /proc. Here: the helpers, the process tree and
//! failure classification; `attribution.rs`: bytes, mounts, containers.

mod attribution;
mod identity;
mod missing;

use super::*;
use crate::{
    event::{Addr, ExitStatus, FailedCall, Handler, MountPages, Syscall},
    host::{
        FdEntry,
        fixture::{Fixture, SELF_NS},
    },
    state::{
        causes::Cause,
        failures::{FailureKind, Op, UsageSource},
        mounts::Mount,
    },
};

pub const SHM: Dev = Dev(40);
pub use crate::units::MIB;

/// Builds events of one stream, with increasing kernel times.
pub struct Stream {
    ts: u64,
}

impl Stream {
    pub fn new() -> Self {
        Self { ts: 1_000_000 }
    }

    pub fn h(&mut self, pid: u32, ppid: u32) -> Header {
        self.ts += 1_000;
        Header {
            ts_ns: self.ts,
            pid,
            tid: pid,
            ppid,
            ns_pid: 0,
            mnt_ns: SELF_NS,
            cgroup_id: 0,
            memcg_id: 0,
            comm: format!("worker_{pid}"),
        }
    }
}

pub fn file(ino: u64, name: &str, size: i64, allocated: u64, used_pages: u64) -> FileRef {
    FileRef {
        dev: SHM,
        ino,
        name: Some(name.into()),
        size,
        allocated,
        unlinked: false,
        mount: MountPages {
            dev: SHM,
            max_pages: 64 * MIB / 4096,
            used_pages,
        },
    }
}

/// `syscall` on fd `fd` of `file` asked for `bytes` at offset 0 and got ENOSPC.
pub fn enospc(h: Header, syscall: Syscall, fd: i32, bytes: u64, file: FileRef) -> Event {
    Event::SyscallFailed {
        h,
        limits: None,
        mnt_flags: 0,
        errno: libc::ENOSPC,
        call: FailedCall::OnFile {
            syscall,
            prot: None,
            mountpoint: None,
            fd,
            offset: Some(0),
            bytes: Some(bytes),
            file,
        },
    }
}

pub fn setup() -> (State, Fixture, Stream) {
    let mut host = Fixture::with_shm(SHM, 64 * MIB);
    let st = State::new(0, &mut host);
    (st, host, Stream::new())
}

/// A trainer (10) with workers 11 and 12; 12 maps an 8 MiB segment at
/// 0x7f0000000000 and faults on its second page with a full mount.
pub fn sigbus_stream(st: &mut State, host: &mut Fixture, s: &mut Stream) {
    // The worker's fd 5 on its segment and its mapping, as /proc lists them.
    host.file(SHM, 100, 8 * MIB as i64, 0, 1);
    host.open_fd(12, 5, SHM, 100);
    host.maps.insert(
        12,
        vec![crate::host::MapsEntry {
            start: Addr(0x7f00_0000_0000),
            end: Addr(0x7f00_0000_0000 + 8 * MIB),
            file_offset: 0,
            dev: SHM,
            ino: 100,
            name: Some("torch_12_1".into()),
        }],
    );
    let evs = vec![
        Event::Fork {
            h: s.h(10, 1),
            child: 11,
        },
        Event::Fork {
            h: s.h(10, 1),
            child: 12,
        },
        Event::Opened {
            h: s.h(12, 10),
            syscall: Syscall::Openat,
            fd: Some(5),
            flags: libc::O_CREAT as u64,
            file: file(100, "torch_12_1", 0, 0, 16000),
        },
        Event::Truncated {
            h: s.h(12, 10),
            fd: 5,
            length: 8 * MIB,
            file: file(100, "torch_12_1", 8 * MIB as i64, 0, 16000),
        },
        Event::Mapped {
            h: s.h(12, 10),
            addr: Addr(0x7f00_0000_0000),
            len: 8 * MIB,
            prot: 3,
            flags: 1,
            offset: 0,
            file: file(100, "torch_12_1", 8 * MIB as i64, 0, 16000),
            mountpoint: None,
        },
        Event::Sigbus {
            h: s.h(12, 10),
            target: 12,
            target_tid: 12,
            si_code: 2,
            si_errno: 0,
            addr: Addr(0x7f00_0000_1010),
            mount: Some(MountPages {
                dev: SHM,
                max_pages: 16384,
                used_pages: 16384,
            }),
        },
    ];
    for ev in &evs {
        st.apply(ev, host);
    }
}

#[test]
fn sigbus_in_a_tmpfs_mapping_is_the_first_failure_with_file_and_offset() {
    let (mut st, mut host, mut s) = setup();
    sigbus_stream(&mut st, &mut host, &mut s);
    let v = st.failures.ordered();
    assert_eq!(v.len(), 1);
    let f = &v[0];
    assert_eq!(
        (f.pid, f.kind, f.si_code),
        (12, FailureKind::Sigbus, Some(2))
    );
    assert_eq!(f.path.as_deref(), Some("/dev/shm/torch_12_1"));
    assert_eq!(f.offset, Some(0x1010));
    assert_eq!(f.fault_addr, Some(Addr(0x7f00_0000_1010)));
    let m = f.mount.as_ref().unwrap();
    assert_eq!(
        (m.source, m.used_bytes, m.free_bytes),
        (UsageSource::Kernel, Some(64 * MIB), Some(0))
    );
    assert_eq!(f.why, Cause::PageFull);
    assert_eq!(f.ancestry.first().map(|a| a.pid), Some(10));
    // The mount as it stood at its first failure is kept.
    assert_eq!(
        st.failures.at_first_failure(SHM).unwrap().used_bytes,
        Some(64 * MIB)
    );
    assert_eq!(f.events_before.len(), 3, "open, ftruncate, mmap");
}

#[test]
fn a_sigbus_sent_by_a_process_or_past_the_end_or_unmapped_is_not_a_shm_failure() {
    let (mut st, mut host, mut s) = setup();
    sigbus_stream(&mut st, &mut host, &mut s);
    let sig = |s: &mut Stream, sender: u32, target: u32, code: i32, addr: u64| Event::Sigbus {
        h: s.h(sender, 10),
        target,
        target_tid: target,
        si_code: code,
        si_errno: 0,
        addr: Addr(addr),
        mount: None,
    };
    // kill(getpid(), SIGBUS) from a handler: SI_USER.
    st.apply(&sig(&mut s, 11, 11, 0, 0), &mut host);
    // From another process: SI_TKILL.
    st.apply(&sig(&mut s, 10, 11, -6, 0), &mut host);
    // Nothing mapped there.
    st.apply(&sig(&mut s, 11, 11, 2, 0x1234_0000), &mut host);
    // Past the end of a file shrunk to one page.
    host.file(SHM, 100, 4096, 4096, 1);
    st.apply(
        &Event::Truncated {
            h: s.h(12, 10),
            fd: 5,
            length: 4096,
            file: file(100, "torch_12_1", 4096, 4096, 10),
        },
        &mut host,
    );
    st.apply(&sig(&mut s, 12, 12, 2, 0x7f00_0000_3000), &mut host);
    // The same access again after a handler returned: a refault.
    st.apply(&sig(&mut s, 12, 12, 2, 0x7f00_0000_1010), &mut host);

    assert_eq!(st.failures.len(), 1, "still only the first one");
    assert_eq!(st.failures.all()[0].refaults, 1);
    let reasons: Vec<&str> = st
        .failures
        .other()
        .iter()
        .map(|o| o.reason.words())
        .collect();
    assert_eq!(reasons.len(), 4);
    assert!(reasons[0].contains("itself"));
    assert!(reasons[1].contains("another process"));
    assert!(reasons[2].contains("not in a tmpfs mapping"));
    assert!(reasons[3].contains("beyond the end"));
    assert!(st.procs.get(11).unwrap().sigbus_reraised);
}

#[test]
fn a_sigbus_where_a_tracked_range_was_unmapped_and_mapped_again_reads_what_is_there_now() {
    let (mut st, mut host, mut s) = setup();
    let (start, end) = (Addr(0x7f00_0000_0000), Addr(0x7f00_0000_0000 + 8 * MIB));
    let entry = |dev: Dev, ino: u64, name: &str| crate::host::MapsEntry {
        start,
        end,
        file_offset: 0,
        dev,
        ino,
        name: Some(name.into()),
    };
    let sigbus = |s: &mut Stream, pid: u32, addr: u64| Event::Sigbus {
        h: s.h(pid, 10),
        target: pid,
        target_tid: pid,
        si_code: 2,
        si_errno: 0,
        addr: Addr(addr),
        mount: None,
    };
    for (pid, ino) in [(12, 100), (13, 200)] {
        host.file(SHM, ino, 8 * MIB as i64, 0, 0);
        host.stats.insert(pid, (10, format!("worker_{pid}")));
        host.maps
            .insert(pid, vec![entry(SHM, ino, "seg (deleted)")]);
        st.apply(
            &Event::Mapped {
                h: s.h(pid, 10),
                addr: start,
                len: 8 * MIB,
                prot: 3,
                flags: 1,
                offset: 0,
                file: file(ino, &format!("seg_{pid}"), 8 * MIB as i64, 0, 16000),
                mountpoint: None,
            },
            &mut host,
        );
    }
    // Within one tick, 12 maps a file of another filesystem over the same
    // range, and 13 another tmpfs file: munmap is not hooked, and the new
    // mmap of a non-tmpfs file sends no event.
    const DISK: Dev = Dev(2049);
    host.file(DISK, 7, 4096, 4096, 1);
    host.maps
        .insert(12, vec![entry(DISK, 7, "/data/shard.bin")]);
    host.file(SHM, 300, 8 * MIB as i64, 0, 1);
    host.maps.insert(13, vec![entry(SHM, 300, "psm_next")]);

    // A SIGBUS past the end of the disk file is no shm failure.
    st.apply(&sigbus(&mut s, 12, start.0 + 0x2000), &mut host);
    assert!(
        st.failures.all().is_empty(),
        "not read against the old range"
    );
    assert!(
        st.failures.other()[0]
            .reason
            .words()
            .contains("not in a tmpfs mapping")
    );
    // A SIGBUS in the new tmpfs file names that file.
    st.apply(&sigbus(&mut s, 13, start.0 + 0x2000), &mut host);
    let f = &st.failures.all()[0];
    assert_eq!(f.pid, 13);
    assert_eq!(f.path.as_deref(), Some("/dev/shm/psm_next"));
}

#[test]
fn a_sigbus_on_a_mapping_made_before_tracing_is_resolved_through_the_host() {
    let (mut st, mut host, mut s) = setup();
    host.maps.insert(
        20,
        vec![crate::host::MapsEntry {
            start: Addr(0x5000_0000),
            end: Addr(0x5010_0000),
            file_offset: 0x10000,
            dev: SHM,
            ino: 9,
            name: Some("psm_abc".into()),
        }],
    );
    st.apply(
        &Event::Sigbus {
            h: s.h(20, 1),
            target: 20,
            target_tid: 21,
            si_code: 2,
            si_errno: 0,
            addr: Addr(0x5000_2000),
            mount: None,
        },
        &mut host,
    );
    let f = &st.failures.all()[0];
    assert_eq!((f.pid, f.tid, f.offset), (20, 21, Some(0x12000)));
    assert_eq!(f.path.as_deref(), Some("/dev/shm/psm_abc"));
    // No kernel counters in the record: statfs through the host.
    assert_eq!(f.mount.as_ref().unwrap().source, UsageSource::Statfs);
}

#[test]
fn fallocate_enospc_names_file_request_and_free_space() {
    let (mut st, mut host, mut s) = setup();
    st.apply(
        &enospc(
            s.h(30, 1),
            Syscall::Fallocate,
            4,
            32 * MIB,
            file(7, "torch_30_9", 0, 0, 8192),
        ),
        &mut host,
    );
    let f = &st.failures.all()[0];
    assert_eq!(
        (f.kind, f.syscall, f.errno),
        (
            FailureKind::Enospc,
            Some(Op::Syscall(Syscall::Fallocate)),
            Some(28)
        )
    );
    assert_eq!(f.path.as_deref(), Some("/dev/shm/torch_30_9"));
    assert_eq!(f.bytes, Some(32 * MIB));
    assert_eq!(
        f.why,
        Cause::Full {
            syscall: Syscall::Fallocate,
            errno: libc::ENOSPC,
            asked: Some(32 * MIB),
            free: Some(32 * MIB)
        }
    );
}

#[test]
fn open_failures_count_only_on_tmpfs() {
    let (mut st, mut host, mut s) = setup();
    host.dirs.insert(40, "/dev/shm".into());
    host.usage.get_mut(&SHM).unwrap().inodes_used = 1000;
    let open = |s: &mut Stream, path: &str| Event::SyscallFailed {
        h: s.h(40, 1),
        limits: None,
        mnt_flags: 0,
        errno: libc::ENOSPC,
        call: FailedCall::Open {
            syscall: Syscall::Openat,
            dirfd: None,
            path: path.into(),
        },
    };
    st.apply(&open(&mut s, "/var/tmp/x"), &mut host);
    assert!(st.failures.is_empty(), "ext4 is not shared memory");
    st.apply(&open(&mut s, "sem.lock"), &mut host);
    let f = &st.failures.all()[0];
    assert_eq!(f.path.as_deref(), Some("/dev/shm/sem.lock"));
    assert_eq!(f.why, Cause::CreateAtInodeLimit { total: Some(1000) });
}

#[test]
fn oom_kill_and_exit_status() {
    let (mut st, mut host, mut s) = setup();
    st.apply(
        &Event::Fork {
            h: s.h(50, 1),
            child: 51,
        },
        &mut host,
    );
    st.apply(
        &Event::OomVictim {
            h: s.h(99, 1),
            victim: 51,
            shmem_rss: 40 * MIB,
        },
        &mut host,
    );
    st.apply(
        &Event::Exit {
            h: s.h(51, 50),
            status: ExitStatus::from_kernel(9),
        },
        &mut host,
    );
    let f = &st.failures.all()[0];
    assert_eq!(
        (f.kind, f.pid, f.bytes),
        (FailureKind::OomKill, 51, Some(40 * MIB))
    );
    assert_eq!(f.ancestry[0].pid, 50);
    assert_eq!(st.procs.get(51).unwrap().exit_signal, Some(9));
    assert_eq!(st.live_pids(), vec![50]);
}

#[test]
fn exec_reads_nothing_until_a_tmpfs_is_touched_and_delivery_records_the_handler() {
    let (mut st, mut host, mut s) = setup();
    // Node-wide (a traced job's exec reads at once: the next test).
    st.read_lazily_at_exec();
    host.cmdlines.insert(60, "python train.py".into());
    st.apply(
        &Event::Exec {
            h: s.h(60, 1),
            filename: "/usr/bin/python3".into(),
            old_pid: 60,
        },
        &mut host,
    );
    st.apply(
        &Event::Exec {
            h: s.h(61, 1),
            filename: "/bin/gone".into(),
            old_pid: 61,
        },
        &mut host,
    );
    st.apply(
        &Event::SigbusDelivered {
            h: s.h(60, 1),
            si_code: 2,
            handler: Handler::Function(0x4000),
        },
        &mut host,
    );
    // A process start reads nothing from /proc: the exec event's path.
    assert_eq!(
        st.procs.get(60).unwrap().cmdline.as_deref(),
        Some("/usr/bin/python3")
    );
    // Touching a tmpfs makes it worth the read.
    st.apply(
        &Event::Opened {
            h: s.h(60, 1),
            syscall: Syscall::Openat,
            fd: Some(3),
            flags: libc::O_CREAT as u64,
            file: file(300, "seg", 0, 0, 0),
        },
        &mut host,
    );
    assert_eq!(
        st.procs.get(60).unwrap().cmdline.as_deref(),
        Some("python train.py")
    );
    // One that is gone keeps its program's path.
    st.read_cmdline(&mut host, 61);
    assert_eq!(
        st.procs.get(61).unwrap().cmdline.as_deref(),
        Some("/bin/gone")
    );
    assert!(st.procs.get(60).unwrap().sigbus_handler_ran);
}

#[test]
fn a_traced_jobs_exec_reads_its_command_line_at_once() {
    let (mut st, mut host, mut s) = setup();
    host.cmdlines.insert(60, "python train.py".into());
    st.apply(
        &Event::Exec {
            h: s.h(60, 1),
            filename: "/usr/bin/python3".into(),
            old_pid: 60,
        },
        &mut host,
    );
    assert_eq!(
        st.procs.get(60).unwrap().cmdline.as_deref(),
        Some("python train.py")
    );
}

/// A DataLoader's events: main 10 forks workers 11, 12, 13; 13 and 11 map
/// 16 MiB segments named `{names}_{w}_1` and fault on them, 13 first, on a
/// full mount. (Their deaths are the caller's to add.)
pub fn dataloader_events(s: &mut Stream, names: &str) -> Vec<Event> {
    let mut evs = Vec::new();
    for w in [11, 12, 13] {
        evs.push(Event::Fork {
            h: s.h(10, 1),
            child: w,
        });
    }
    for (w, base) in [(13u32, 0x7f00_0000_0000u64), (11, 0x7f10_0000_0000)] {
        let f = file(
            w as u64,
            &format!("{names}_{w}_1"),
            16 * MIB as i64,
            0,
            16000,
        );
        evs.push(Event::Opened {
            h: s.h(w, 10),
            syscall: Syscall::Openat,
            fd: Some(5),
            flags: libc::O_CREAT as u64,
            file: f.clone(),
        });
        evs.push(Event::Mapped {
            h: s.h(w, 10),
            addr: Addr(base),
            len: 16 * MIB,
            prot: 3,
            flags: 1,
            offset: 0,
            file: f,
            mountpoint: None,
        });
    }
    for (w, base) in [(13u32, 0x7f00_0000_0000u64), (11, 0x7f10_0000_0000)] {
        evs.push(Event::Sigbus {
            h: s.h(w, 10),
            target: w,
            target_tid: w,
            si_code: 2,
            si_errno: 0,
            addr: Addr(base + 8 * MIB),
            mount: Some(MountPages {
                dev: SHM,
                max_pages: 16384,
                used_pages: 16384,
            }),
        });
    }
    evs
}
