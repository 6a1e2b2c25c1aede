//! What the host tells state about a process, through the fixture: its
//! memory cgroup, its pid in its own namespace, its container's names, the
//! libraries it maps, and a mount the kernel named when no table could.

use super::*;
use crate::{
    host::{MapsEntry, cgroup::Names, memcg::Memcg},
    state::causes::Cause,
};

fn memcg(path: &str, limit: u64, usage: u64, shmem: u64) -> Memcg {
    Memcg {
        path: path.into(),
        version: 1,
        limit_bytes: Some(limit),
        usage_bytes: usage,
        shmem_bytes: Some(shmem),
        own_limit_bytes: Some(limit),
        limit_path: Some(path.into()),
        limit_raw: Some(path.into()),
        ..Default::default()
    }
}

/// `pid` creates file `ino` of `allocated` bytes; its open carries the
/// kernel's memory cgroup id `memcg_id` (0: none).
fn create(
    st: &mut State,
    host: &mut Fixture,
    s: &mut Stream,
    (pid, memcg_id): (u32, u64),
    ino: u64,
    allocated: u64,
) {
    host.file(SHM, ino, allocated as i64, allocated, 1);
    host.open_fd(pid, 3, SHM, ino);
    st.apply(
        &Event::Opened {
            h: Header {
                memcg_id,
                ..s.h(pid, 1)
            },
            syscall: Syscall::Openat,
            fd: Some(3),
            flags: libc::O_CREAT as u64,
            file: file(ino, "x", 0, 0, 100),
        },
        host,
    );
    st.apply(
        &Event::Truncated {
            h: s.h(pid, 1),
            fd: 3,
            length: allocated,
            file: file(ino, "x", allocated as i64, allocated, 100),
        },
        host,
    );
}

#[test]
fn a_writer_keeps_the_memory_cgroup_it_created_files_in() {
    let (mut st, mut host, mut s) = setup();
    host.memcgs.insert(30, (1, "/job".into()));
    host.memcg_stats.insert(
        (1, "/job".into()),
        memcg("/job", 48 * MIB, 40 * MIB, 30 * MIB),
    );
    create(&mut st, &mut host, &mut s, (30, 0), 5, MIB);
    // Exited (or moved): /proc would show the root now.
    host.memcgs.insert(30, (1, "/".into()));
    st.apply(
        &enospc(
            s.h(30, 1),
            Syscall::Write,
            3,
            4096,
            file(5, "x", 0, 0, 16384),
        ),
        &mut host,
    );
    let f = &st.failures.all()[0];
    assert_eq!(f.memcg.as_ref().map(|m| m.path.as_str()), Some("/job"));
    assert_eq!(f.memcg.as_ref().unwrap().limit_bytes, Some(48 * MIB));
}

#[test]
fn a_failure_in_a_pid_namespace_shows_the_pid_the_process_sees() {
    let (mut st, mut host, mut s) = setup();
    host.ns_pids.insert(40, 9);
    host.ns_pids.insert(41, 41);
    for pid in [40, 41] {
        st.apply(
            &enospc(
                s.h(pid, 1),
                Syscall::Fallocate,
                3,
                MIB,
                file(pid as u64, "x", 0, 0, 16384),
            ),
            &mut host,
        );
    }
    let by = |pid| st.failures.all().iter().find(|f| f.pid == pid).unwrap();
    assert_eq!(by(40).ns_pid, Some(9));
    assert_eq!(
        by(41).ns_pid,
        None,
        "the same number: not in a namespace of its own"
    );
    assert_eq!(st.procs.get(40).unwrap().ns_pid, Some(9));
}

#[test]
fn containers_are_named_by_the_host_on_the_tick() {
    let (mut st, mut host, mut s) = setup();
    let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let path = format!("/libpod_parent/libpod-{id}");
    host.cgroup_ids.insert(555, path.clone());
    host.container_names.insert(
        path.clone(),
        Names {
            container: Some("trainer".into()),
            ..Default::default()
        },
    );
    let mut h = s.h(90, 1);
    h.cgroup_id = 555;
    st.apply(
        &Event::FdsReceived {
            h,
            control_bytes: 0,
        },
        &mut host,
    );
    // Seen on one tick, named on the next (a few lookups a tick).
    st.tick(&mut host);
    assert!(st.containers.by_cgroup(&path).unwrap().name.is_none());
    st.tick(&mut host);
    let c = st.containers.by_cgroup(&path).unwrap();
    assert_eq!(
        (c.name.as_deref(), c.label()),
        (Some("trainer"), "podman trainer".to_string())
    );
    assert_eq!(
        st.procs
            .get(90)
            .unwrap()
            .container
            .as_ref()
            .unwrap()
            .name
            .as_deref(),
        Some("trainer")
    );
}

#[test]
fn a_mount_its_writers_memory_cgroup_cannot_fill_is_flagged_with_the_facts() {
    let (mut st, mut host, mut s) = setup();
    host.memcgs.insert(30, (1, "/job".into()));
    // 24 MiB allowed, 10 in use of which 8 is shmem: 22 MiB of room.
    host.memcg_stats.insert(
        (1, "/job".into()),
        memcg("/job", 24 * MIB, 10 * MIB, 8 * MIB),
    );
    create(&mut st, &mut host, &mut s, (30, 0), 5, 8 * MIB);
    st.tick(&mut host);
    let m = st.mount_stats.get(SHM).unwrap();
    assert_eq!(m.memory_room_bytes, Some(22 * MIB));
    let h = m.headroom.as_ref().expect("64 MiB can never fill");
    assert_eq!((h.size, h.room, h.pod_limit), (64 * MIB, 22 * MIB, None));
    assert_eq!(h.memcg.path, "/job");
    // A cgroup with room for the whole mount: nothing to say.
    host.memcg_stats.insert(
        (1, "/job".into()),
        memcg("/job", 128 * MIB, 10 * MIB, 8 * MIB),
    );
    host.advance(Duration::from_secs(2));
    st.tick(&mut host);
    assert!(st.mount_stats.get(SHM).unwrap().headroom.is_none());
}

/// A writer that lived a few milliseconds (dd) is gone before /proc could
/// say where its pages went: the id the kernel put in its events does.
#[test]
fn a_writer_gone_before_proc_was_read_is_placed_by_the_kernels_memcg_id() {
    let (mut st, mut host, mut s) = setup();
    // No /proc answer for 30 at any time, and the id unknown at first: a
    // cgroup made after the last walk.
    host.memcg_stats.insert(
        (1, "/job".into()),
        memcg("/job", 24 * MIB, 10 * MIB, 8 * MIB),
    );
    create(&mut st, &mut host, &mut s, (30, 77), 5, 8 * MIB);
    assert_eq!(st.procs.get(30).unwrap().memcg, None);
    // The next walk knows it: the tick resolves it, the process long gone.
    host.memcg_ids.insert(77, (1, "/job".into()));
    st.tick(&mut host);
    assert_eq!(
        st.procs.get(30).unwrap().memcg,
        Some((1, "/job".to_string()))
    );
    let h = st.mount_stats.get(SHM).unwrap().headroom.as_ref();
    assert_eq!(h.map(|h| h.memcg.path.as_str()), Some("/job"));
}

/// A failure carries the failing task's memory cgroup id: its report names
/// the cgroup even when the process had no earlier tmpfs event and is gone.
#[test]
fn a_failure_names_the_memory_cgroup_the_kernel_put_in_its_record() {
    let (mut st, mut host, mut s) = setup();
    host.memcg_ids.insert(78, (1, "/job".into()));
    host.memcg_stats.insert(
        (1, "/job".into()),
        memcg("/job", 48 * MIB, 40 * MIB, 30 * MIB),
    );
    let h = Header {
        memcg_id: 78,
        ..s.h(31, 1)
    };
    st.apply(
        &enospc(h, Syscall::Write, 3, 4096, file(6, "x", 0, 0, 16384)),
        &mut host,
    );
    let f = &st.failures.all()[0];
    assert_eq!(f.memcg.as_ref().map(|m| m.path.as_str()), Some("/job"));
    assert_eq!(f.memcg.as_ref().unwrap().limit_bytes, Some(48 * MIB));
}

/// Moved to another memory cgroup: its later events say where it is now.
#[test]
fn a_process_moved_to_another_memory_cgroup_follows_the_kernels_id() {
    let (mut st, mut host, mut s) = setup();
    host.memcg_ids.insert(80, (1, "/a".into()));
    host.memcg_ids.insert(81, (1, "/b".into()));
    for id in [80, 81] {
        let h = Header {
            memcg_id: id,
            ..s.h(32, 1)
        };
        st.apply(
            &Event::FdsReceived {
                h,
                control_bytes: 0,
            },
            &mut host,
        );
    }
    assert_eq!(st.procs.get(32).unwrap().memcg, Some((1, "/b".to_string())));
}

#[test]
fn the_failing_process_libraries_tell_its_user() {
    let (mut st, mut host, mut s) = setup();
    let lib = |name: &str| MapsEntry {
        start: Addr(0x1000),
        end: Addr(0x2000),
        file_offset: 0,
        dev: Dev::new(8, 1),
        ino: 1,
        name: Some(name.into()),
    };
    host.maps.insert(
        50,
        vec![
            lib("libnccl.so.2"),
            lib("libc.so.6"),
            lib("libcudart.so.12"),
        ],
    );
    st.apply(
        &enospc(
            s.h(50, 1),
            Syscall::Fallocate,
            3,
            MIB,
            file(9, "x", 0, 0, 16384),
        ),
        &mut host,
    );
    let mut libs = st.failures.all()[0].libraries.clone();
    libs.sort();
    assert_eq!(libs, vec!["libcudart", "libnccl"]);
}

#[test]
fn a_mount_no_table_shows_is_named_by_the_kernel() {
    let (mut st, mut host, mut s) = setup();
    // A namespace that lived milliseconds: no mount table for its device.
    let gone = Dev(99);
    let f = FileRef {
        dev: gone,
        mount: MountPages {
            dev: gone,
            max_pages: 16,
            used_pages: 16,
        },
        ..file(3, "seg", 0, 0, 16)
    };
    st.apply(
        &Event::SyscallFailed {
            h: s.h(60, 1),
            limits: None,
            mnt_flags: 0,
            errno: libc::ENOSPC,
            call: FailedCall::OnFile {
                syscall: Syscall::Fallocate,
                fd: 3,
                offset: Some(0),
                bytes: Some(MIB),
                prot: None,
                mountpoint: Some("/dev/shm".into()),
                file: f,
            },
        },
        &mut host,
    );
    let f = &st.failures.all()[0];
    assert_eq!(f.path.as_deref(), Some("/dev/shm/seg"));
    assert_eq!(f.mount.as_ref().unwrap().size_bytes, Some(64 * 1024));
    assert!(matches!(f.why, Cause::Full { asked: Some(b), .. } if b == MIB));
}
