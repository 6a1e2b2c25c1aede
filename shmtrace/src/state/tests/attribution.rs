//! Attribution, namespaces and containers, from synthetic streams.

use super::*;

#[test]
fn bytes_are_credited_to_the_creator_and_freed_files_leave() {
    let (mut st, mut host, mut s) = setup();
    sigbus_stream(&mut st, &mut host, &mut s);
    // The worker filled 4 MiB; the trainer received the fd over a socket.
    host.file(SHM, 100, 8 * MIB as i64, 4 * MIB, 0);
    let seg = host.files[&(SHM, 100)];
    host.fds.insert(
        12,
        vec![FdEntry {
            fd: 5,
            stat: seg,
            name: None,
        }],
    );
    host.fds.insert(
        10,
        vec![FdEntry {
            fd: 9,
            stat: seg,
            name: Some("torch_12_1".into()),
        }],
    );
    st.apply(
        &Event::FdsReceived {
            h: s.h(10, 1),
            control_bytes: 24,
        },
        &mut host,
    );
    st.tick(&mut host);
    let f = &st.files.get((SHM, 100)).unwrap();
    assert_eq!(f.creator, Some(12));
    assert_eq!(f.allocated_by.get(&12), Some(&(4 * MIB)));
    assert_eq!(
        f.fd_holders.iter().copied().collect::<Vec<_>>(),
        vec![10, 12]
    );
    assert_eq!(st.procs.get(10).unwrap().held_bytes, 4 * MIB);
    assert_eq!(st.mount_stats.get(SHM).unwrap().tracked_bytes, 4 * MIB);

    // The worker exits, the trainer closes it: unlinked and unheld, freed.
    st.apply(
        &Event::Exit {
            h: s.h(12, 10),
            status: ExitStatus::from_kernel(7),
        },
        &mut host,
    );
    host.fds.insert(10, vec![]);
    host.fds.remove(&12);
    st.apply(
        &Event::FdsReceived {
            h: s.h(10, 1),
            control_bytes: 0,
        },
        &mut host,
    );
    st.tick(&mut host);
    assert!(st.files.is_empty(), "{:?}", st.files.all());
    assert_eq!(st.procs.get(10).unwrap().held_bytes, 0);
    assert_eq!(st.procs.get(10).unwrap().peak_held_bytes, 4 * MIB);
}

#[test]
fn first_failure_on_a_mount_lists_its_holders() {
    let (mut st, mut host, mut s) = setup();
    host.file(SHM, 200, 48 * MIB as i64, 48 * MIB, 1);
    let hoard = host.files[&(SHM, 200)];
    host.fds.insert(
        70,
        vec![FdEntry {
            fd: 3,
            stat: hoard,
            name: Some("hoard".into()),
        }],
    );
    st.apply(
        &Event::FdsReceived {
            h: s.h(70, 1),
            control_bytes: 24,
        },
        &mut host,
    );
    sigbus_stream(&mut st, &mut host, &mut s);
    let f = &st.failures.all()[0];
    assert_eq!(
        f.holders.first().map(|h| (h.pid, h.held_bytes)),
        Some((70, 48 * MIB))
    );
}

/// A short job (the suite's order workload, in a VM or on a busy node) is
/// gone by the time its first failure is read: no holder's fd answers,
/// yet the parent's ballast it filled with an unseen fallocate is still
/// there by name, and is what held the mount.
#[test]
fn holders_gone_before_the_first_failure_is_read_are_measured_by_name() {
    let (mut st, mut host, mut s) = setup();
    st.apply(
        &Event::Opened {
            h: s.h(20, 1),
            syscall: Syscall::Openat,
            fd: Some(3),
            flags: libc::O_CREAT as u64,
            file: file(300, "ballast", 0, 0, 0),
        },
        &mut host,
    );
    // Then 48 MiB of fallocate (no event), and both processes exit before
    // the failure is applied: /proc has neither, the name is there.
    host.file(SHM, 300, 48 * MIB as i64, 48 * MIB, 1);
    host.names.insert((SHM, "ballast".into()), 300);
    let w = file(301, "w2", 32 * MIB as i64, 0, (48 * MIB) / 4096);
    st.apply(
        &enospc(s.h(21, 1), Syscall::Fallocate, 4, 32 * MIB, w),
        &mut host,
    );
    let f = &st.failures.all()[0];
    assert_eq!(
        f.holders
            .iter()
            .map(|h| (h.pid, h.held_bytes))
            .collect::<Vec<_>>(),
        vec![(20, 48 * MIB)]
    );
    let b = st.files.get((SHM, 300)).unwrap();
    assert!(!b.unlinked, "its name is still there");
    // Removed while the books still say 20 holds it: unlinked, not freed.
    host.names.clear();
    st.tick(&mut host);
    let b = st.files.get((SHM, 300)).expect("held files stay");
    assert!(b.unlinked);
}

#[test]
fn a_create_seen_before_its_fd_holds_the_file_until_the_fds_are_listed() {
    // The trampoline backend's create hook: no fd yet.
    let created = |s: &mut Stream, pid| Event::Opened {
        h: s.h(pid, 1),
        syscall: Syscall::Openat,
        fd: None,
        flags: libc::O_CREAT as u64,
        file: file(300, "ballast", 0, 0, 0),
    };
    // Gone before its fds could be listed, as with a known fd: it holds
    // what the name says.
    let (mut st, mut host, mut s) = setup();
    st.apply(&created(&mut s, 20), &mut host);
    host.file(SHM, 300, 48 * MIB as i64, 48 * MIB, 1);
    host.names.insert((SHM, "ballast".into()), 300);
    let w = file(301, "w2", 32 * MIB as i64, 0, (48 * MIB) / 4096);
    st.apply(
        &enospc(s.h(21, 1), Syscall::Fallocate, 4, 32 * MIB, w),
        &mut host,
    );
    let f = &st.failures.all()[0];
    let holders: Vec<(u32, u64)> = f.holders.iter().map(|h| (h.pid, h.held_bytes)).collect();
    assert_eq!(holders, vec![(20, 48 * MIB)]);
    assert_eq!(st.files.get((SHM, 300)).unwrap().creator, Some(20));

    // Alive: the listing replaces the placeholder with the real fd, and
    // once it closes that fd, the process holds nothing.
    let (mut st, mut host, mut s) = setup();
    let stat = crate::host::FileStat {
        dev: SHM,
        ino: 300,
        size: MIB as i64,
        allocated: MIB,
        nlink: 1,
        regular: true,
    };
    host.fds.insert(
        20,
        vec![FdEntry {
            fd: 7,
            stat,
            name: Some("ballast".into()),
        }],
    );
    host.files.insert((SHM, 300), stat);
    st.apply(&created(&mut s, 20), &mut host);
    st.tick(&mut host);
    assert_eq!(
        st.files.fd_checks(),
        vec![(20, 7, (SHM, 300))],
        "the placeholder is gone"
    );
    host.fds.insert(20, vec![]);
    st.tick(&mut host);
    st.tick(&mut host);
    assert!(st.files.fd_checks().is_empty());
}

#[test]
fn files_no_traced_process_made_are_listed_at_the_first_failure() {
    let (mut st, mut host, mut s) = setup();
    // Already there: an old job's file, and an empty one (no bytes, no list).
    host.file(SHM, 900, 5 * MIB as i64, 5 * MIB, 1);
    host.names.insert((SHM, "old_job".into()), 900);
    host.file(SHM, 901, 0, 0, 1);
    host.names.insert((SHM, "empty".into()), 901);
    // The traced worker's own segment is listed too: it is no stray.
    host.file(SHM, 100, 8 * MIB as i64, 4 * MIB, 1);
    host.names.insert((SHM, "torch_12_1".into()), 100);
    sigbus_stream(&mut st, &mut host, &mut s);
    let f = &st.failures.all()[0];
    assert_eq!((f.stray_count, f.stray_bytes), (1, 5 * MIB));
    assert_eq!(f.strays[0].name, "old_job");
    assert_eq!(f.strays[0].ino, 900);
}

#[test]
fn new_namespaces_are_anchored_and_idle_ones_let_go() {
    let (mut st, mut host, mut s) = setup();
    let pod_ns = 4026532999;
    let pod_shm = Dev(77);
    host.mounts.insert(
        pod_ns,
        vec![Mount {
            dev: pod_shm,
            mountpoint: "/dev/shm".into(),
            fstype: "tmpfs".into(),
            noexec: false,
        }],
    );
    let mut h = s.h(80, 1);
    h.mnt_ns = pod_ns;
    let seg = FileRef {
        dev: pod_shm,
        ..file(5, "x", 0, 0, 0)
    };
    st.apply(
        &Event::Opened {
            h: h.clone(),
            syscall: Syscall::Openat,
            fd: Some(3),
            flags: libc::O_CREAT as u64,
            file: seg.clone(),
        },
        &mut host,
    );
    assert_eq!(host.anchored(), vec![pod_ns]);
    assert_eq!(st.mounts.by_dev(pod_shm).unwrap().mountpoint, "/dev/shm");
    assert!(st.files.contains((pod_shm, 5)));

    st.release_idle_namespaces = Some(Duration::from_secs(60));
    st.apply(
        &Event::Exit {
            h: h.clone(),
            status: ExitStatus::from_kernel(0),
        },
        &mut host,
    );
    st.tick(&mut host); // first seen idle
    host.advance(Duration::from_secs(59));
    st.tick(&mut host);
    assert!(host.released.is_empty(), "still within the grace");
    host.advance(Duration::from_secs(2));
    st.tick(&mut host);
    assert_eq!(host.released, vec![pod_ns]);
    assert!(!st.files.contains((pod_shm, 5)));
    assert!(st.mount_stats.get(pod_shm).is_none());
}

#[test]
fn a_failed_mount_leaves_the_live_stats_with_its_namespace() {
    let (mut st, mut host, mut s) = setup();
    let pod_ns = 4026532998;
    let pod_shm = Dev(78);
    host.mounts.insert(
        pod_ns,
        vec![Mount {
            dev: pod_shm,
            mountpoint: "/dev/shm".into(),
            fstype: "tmpfs".into(),
            noexec: false,
        }],
    );
    host.file(pod_shm, 5, 16 * MIB as i64, 16 * MIB, 1);
    let mut h = s.h(81, 1);
    h.mnt_ns = pod_ns;
    let full = FileRef {
        dev: pod_shm,
        ..file(5, "x", 16 * MIB as i64, 16 * MIB, 4096)
    };
    st.apply(
        &Event::Opened {
            h: h.clone(),
            syscall: Syscall::Openat,
            fd: Some(3),
            flags: libc::O_CREAT as u64,
            file: full.clone(),
        },
        &mut host,
    );
    let mut later = s.h(81, 1);
    later.mnt_ns = pod_ns;
    st.apply(&enospc(later, Syscall::Write, 3, 4096, full), &mut host);
    st.tick(&mut host);
    assert!(
        st.mount_stats.get(pod_shm).is_some(),
        "shown while it lives"
    );
    st.release_idle_namespaces = Some(Duration::from_secs(60));
    st.apply(
        &Event::Exit {
            h,
            status: ExitStatus::from_kernel(0),
        },
        &mut host,
    );
    st.tick(&mut host);
    host.advance(Duration::from_secs(61));
    st.tick(&mut host);
    assert_eq!(host.released, vec![pod_ns]);
    assert!(
        st.mount_stats.get(pod_shm).is_none(),
        "a dead mount leaves the view and the metrics"
    );
    assert_eq!(
        st.failures.at_first_failure(pod_shm).map(|m| m.dev),
        Some(pod_shm),
        "the report keeps it as it stood at the failure"
    );
}

#[test]
fn failures_carry_their_container_from_the_cgroup_id() {
    let (mut st, mut host, mut s) = setup();
    let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    host.cgroup_ids
        .insert(555, format!("/libpod_parent/libpod-{id}"));
    let mut h = s.h(90, 1);
    h.cgroup_id = 555;
    st.apply(&Event::Fork { h, child: 91 }, &mut host);
    st.apply(
        &enospc(
            s.h(90, 1),
            Syscall::Write,
            1,
            4096,
            file(8, "x", 0, 0, 16384),
        ),
        &mut host,
    );
    // Each header is the truth at its event: this one came from the root cgroup.
    assert!(st.failures.all()[0].container.is_none());
    let mut h = s.h(90, 1);
    h.cgroup_id = 555;
    st.apply(
        &Event::FdsReceived {
            h,
            control_bytes: 0,
        },
        &mut host,
    );
    st.tick(&mut host);
    let p = st.procs.get(90).unwrap();
    let c = p.container.as_ref().unwrap();
    assert_eq!(
        (c.runtime.as_deref(), c.container_id.as_deref()),
        (Some("podman"), Some(id))
    );
}

#[test]
fn memfd_devices_in_no_mount_table_are_remembered() {
    let (mut st, mut host, mut s) = setup();
    let memfd = FileRef {
        dev: Dev(1),
        ..file(3, "memfd:x", 0, 0, 0)
    };
    for _ in 0..3 {
        st.apply(
            &Event::Mapped {
                h: s.h(95, 1),
                addr: Addr(0x1000),
                len: 4096,
                prot: 3,
                flags: 1,
                offset: 0,
                file: memfd.clone(),
                mountpoint: None,
            },
            &mut host,
        );
    }
    assert!(st.mounts.is_unmounted(Dev(1)));
}

#[test]
fn a_named_file_unlinked_while_nobody_held_it_leaves_the_books() {
    let (mut st, mut host, mut s) = setup();
    // 20 creates /dev/shm/psm_x, fills it, closes it (its fd is gone at
    // the tick): nobody holds it, but its name keeps it (and its pages)
    // alive.
    host.file(SHM, 300, MIB as i64, MIB, 1);
    host.names.insert((SHM, "psm_x".into()), 300);
    st.apply(
        &Event::Opened {
            h: s.h(20, 1),
            syscall: Syscall::Openat,
            fd: Some(3),
            flags: libc::O_CREAT as u64,
            file: file(300, "psm_x", MIB as i64, MIB, 256),
        },
        &mut host,
    );
    // It lives on with no fd open.
    host.fds.insert(20, vec![]);
    st.tick(&mut host);
    let f = &st.files.get((SHM, 300)).unwrap();
    assert!(!f.unlinked && f.holders().is_empty());
    assert_eq!(f.allocated_bytes, MIB);
    // Someone runs `rm /dev/shm/psm_x`: no event, but the name is gone.
    host.names.clear();
    st.tick(&mut host);
    assert!(
        !st.files.contains((SHM, 300)),
        "a freed file must not stay listed as linked"
    );
    assert_eq!(st.files.bytes_on(SHM), 0);
}

#[test]
fn churn_of_processes_and_files_leaves_bounded_state() {
    let (mut st, mut host, mut s) = setup();
    // 20,000 short-lived processes, each creating and unlinking a file, and
    // one that failed early and must stay in the report.
    let mut f = file(1, "x", 0, 0, 0);
    f.unlinked = true;
    st.apply(&enospc(s.h(7, 1), Syscall::Fallocate, 3, MIB, f), &mut host);
    st.apply(
        &Event::Exit {
            h: s.h(7, 1),
            status: ExitStatus::from_kernel(1 << 8),
        },
        &mut host,
    );
    for pid in 100..20_100u32 {
        st.apply(
            &Event::Fork {
                h: s.h(1, 0),
                child: pid,
            },
            &mut host,
        );
        let mut fr = file(pid as u64 + 1_000_000, &format!("tmp{pid}"), 4096, 4096, 1);
        fr.unlinked = true;
        st.apply(
            &Event::Opened {
                h: s.h(pid, 1),
                syscall: Syscall::Openat,
                fd: Some(3),
                flags: libc::O_CREAT as u64,
                file: fr,
            },
            &mut host,
        );
        st.apply(
            &Event::Exit {
                h: s.h(pid, 1),
                status: ExitStatus::from_kernel(0),
            },
            &mut host,
        );
        if pid % 1000 == 0 {
            st.tick(&mut host);
        }
    }
    st.tick(&mut host);
    assert!(
        st.procs.len() <= procs::KEEP_EXITED + 2,
        "{} processes kept",
        st.procs.len()
    );
    assert!(st.procs.forgotten() >= 20_000 - procs::KEEP_EXITED as u64);
    assert!(st.procs.contains(7), "a failed process stays");
    assert!(
        st.files.is_empty(),
        "unlinked files of exited processes are freed"
    );
    assert!(st.files.procs_counted() <= procs::KEEP_EXITED + 2);
    assert_eq!(st.failures.len(), 1);
}

#[test]
fn the_peak_is_the_highest_use_any_event_showed_not_only_the_samples() {
    let (mut st, mut host, mut s) = setup();
    // statfs says empty at every tick; the kernel saw the mount at 48 MiB
    // when the file was created, and full at the failure.
    let seg = file(5, "seg", 0, 0, 48 * MIB / 4096);
    st.apply(
        &Event::Opened {
            h: s.h(30, 1),
            syscall: Syscall::Openat,
            fd: Some(3),
            flags: libc::O_CREAT as u64,
            file: seg,
        },
        &mut host,
    );
    st.tick(&mut host);
    let m = st.mount_stats.get(SHM).unwrap();
    assert_eq!((m.used_bytes, m.peak_used_bytes), (Some(0), 48 * MIB));
    st.apply(
        &enospc(
            s.h(30, 1),
            Syscall::Fallocate,
            3,
            MIB,
            file(5, "seg", 0, 0, 64 * MIB / 4096),
        ),
        &mut host,
    );
    assert_eq!(st.mount_stats.get(SHM).unwrap().peak_used_bytes, 64 * MIB);
    st.tick(&mut host);
    assert_eq!(
        st.mount_stats.get(SHM).unwrap().peak_used_bytes,
        64 * MIB,
        "kept"
    );
}

#[test]
fn closes_are_seen_on_the_tick_copies_are_found_and_the_gone_keep_their_books() {
    let (mut st, mut host, mut s) = setup();
    for (pid, ino) in [(20, 300), (21, 301)] {
        host.file(SHM, ino, MIB as i64, MIB, 0);
        host.open_fd(pid, 10, SHM, ino);
        st.apply(
            &Event::Opened {
                h: s.h(pid, 1),
                syscall: Syscall::Openat,
                fd: Some(10),
                flags: libc::O_CREAT as u64,
                file: file(ino, "x", 0, 0, 0),
            },
            &mut host,
        );
    }
    st.tick(&mut host);
    let holders = |st: &State, ino| st.files.get((SHM, ino)).map(|f| f.fd_holders.clone());
    assert_eq!(holders(&st, 300), Some(BTreeSet::from([20])));
    // 20 moves its fd to 3 (F_DUPFD, then close: no event for either);
    // 21's /proc is gone, its exit not applied yet.
    host.fds.insert(20, vec![]);
    host.open_fd(20, 3, SHM, 300);
    host.fds.remove(&21);
    st.tick(&mut host);
    assert_eq!(
        holders(&st, 300),
        Some(BTreeSet::from([20])),
        "found at fd 3"
    );
    assert_eq!(
        holders(&st, 301),
        Some(BTreeSet::from([21])),
        "kept until its exit"
    );
    // 20 closes it: nobody holds the unlinked file, which is freed.
    host.fds.insert(20, vec![]);
    st.tick(&mut host);
    assert!(holders(&st, 300).is_none());
}

#[test]
fn unmaps_are_seen_on_the_tick_from_proc() {
    let (mut st, mut host, mut s) = setup();
    host.file(SHM, 400, 2 * MIB as i64, 2 * MIB, 0);
    host.stats.insert(30, (1, "reader".into()));
    let entry = |start: u64, end: u64, off: u64| crate::host::MapsEntry {
        start: Addr(start),
        end: Addr(end),
        file_offset: off,
        dev: SHM,
        ino: 400,
        name: Some("seg (deleted)".into()),
    };
    host.maps.insert(30, vec![entry(0x10000, 0x210000, 0)]);
    st.apply(
        &Event::Mapped {
            h: s.h(30, 1),
            addr: Addr(0x10000),
            len: 2 * MIB,
            prot: 1,
            flags: 1,
            offset: 0,
            file: file(400, "seg", 2 * MIB as i64, 2 * MIB, 0),
            mountpoint: None,
        },
        &mut host,
    );
    st.tick(&mut host);
    let map_holders = |st: &State| st.files.get((SHM, 400)).map(|f| f.map_holders.clone());
    assert_eq!(map_holders(&st), Some(BTreeSet::from([30])));
    // Half of it unmapped: /proc shows the rest, which still holds it.
    host.maps.insert(30, vec![entry(0x110000, 0x210000, MIB)]);
    st.tick(&mut host);
    assert_eq!(map_holders(&st), Some(BTreeSet::from([30])));
    let m = st.maps.find(30, Addr(0x110000)).unwrap();
    assert_eq!(
        (m.name.as_deref(), m.offset_of(Addr(0x110000))),
        (Some("seg"), MIB)
    );
    assert!(st.maps.find(30, Addr(0x10000)).is_none());
    // All of it: nobody holds the unlinked file any more (its executable
    // is all the file mappings /proc lists).
    let exe = crate::host::MapsEntry {
        start: Addr(0x40_0000),
        end: Addr(0x40_1000),
        file_offset: 0,
        dev: Dev(2049),
        ino: 12,
        name: Some("/usr/bin/reader".into()),
    };
    host.maps.insert(30, vec![exe]);
    st.tick(&mut host);
    assert!(map_holders(&st).is_none());
}

#[test]
fn a_process_whose_address_space_is_gone_keeps_its_mappings_until_its_exit() {
    let (mut st, mut host, mut s) = setup();
    host.file(SHM, 400, 2 * MIB as i64, 2 * MIB, 0);
    host.stats.insert(30, (1, "worker".into()));
    host.maps.insert(
        30,
        vec![crate::host::MapsEntry {
            start: Addr(0x10000),
            end: Addr(0x210000),
            file_offset: 0,
            dev: SHM,
            ino: 400,
            name: Some("seg (deleted)".into()),
        }],
    );
    st.apply(
        &Event::Mapped {
            h: s.h(30, 1),
            addr: Addr(0x10000),
            len: 2 * MIB,
            prot: 3,
            flags: 1,
            offset: 0,
            file: file(400, "seg", 2 * MIB as i64, 2 * MIB, 0),
            mountpoint: None,
        },
        &mut host,
    );
    // Killed: its mm is released before it becomes a zombie, so for a
    // moment it lives (state R) with nothing in /proc/PID/maps.
    host.maps.insert(30, vec![]);
    st.tick(&mut host);
    let holders = st.files.get((SHM, 400)).map(|f| f.map_holders.clone());
    assert_eq!(holders, Some(BTreeSet::from([30])));
    assert!(st.maps.find(30, Addr(0x10000)).is_some());
}
