//! Segments found gone, from synthetic streams: an unlink, then an open of
//! the same name failing with ENOENT, held back for the grace period.

use super::*;
use crate::state::{
    causes::{Cause, Reason},
    failures::FailureKind,
    missing::MISSING_GRACE_NS,
};

fn gone(s: &mut Stream, pid: u32, path: &str) -> Event {
    Event::SyscallFailed {
        h: s.h(pid, 1),
        limits: None,
        mnt_flags: 0,
        errno: libc::ENOENT,
        call: FailedCall::Open {
            syscall: Syscall::Openat,
            dirfd: None,
            path: path.into(),
        },
    }
}

fn unlink(s: &mut Stream, pid: u32, comm: &str, path: &str) -> Event {
    let mut h = s.h(pid, 1);
    h.comm = comm.into();
    Event::Unlinked {
        h,
        path: path.into(),
        dirfd: None,
        dir_dev: None,
    }
}

#[test]
fn an_open_of_a_removed_segment_names_the_remover_after_the_grace() {
    let (mut st, mut host, mut s) = setup();
    st.apply(&unlink(&mut s, 77, "rm", "/dev/shm/torch_5_1"), &mut host);
    let ev = gone(&mut s, 20, "/dev/shm/torch_5_1");
    let at = ev.header().ts_ns;
    st.apply(&ev, &mut host);
    // Held back: the process might create the name next.
    assert!(st.failures.is_empty());
    st.settle(&mut host, at + MISSING_GRACE_NS / 2);
    assert!(st.failures.is_empty());
    st.settle(&mut host, at + MISSING_GRACE_NS);
    let f = &st.failures.all()[0];
    assert_eq!(f.kind, FailureKind::Enoent);
    assert_eq!(f.reason, Reason::SegmentGone);
    assert_eq!(f.path.as_deref(), Some("/dev/shm/torch_5_1"));
    let by = f.removed_by.as_ref().expect("remover");
    assert_eq!((by.pid, by.comm.as_str()), (77, "rm"));
    assert_eq!(f.why, Cause::SegmentGone);
}

#[test]
fn a_name_nobody_removed_says_so_and_sem_lookups_are_no_failure() {
    let (mut st, mut host, mut s) = setup();
    // Another name was removed: no answer for this one.
    st.apply(&unlink(&mut s, 77, "rm", "/dev/shm/other"), &mut host);
    st.apply(&gone(&mut s, 20, "/dev/shm/psm_1"), &mut host);
    // glibc's sem_open looks before it creates.
    st.apply(&gone(&mut s, 21, "/dev/shm/sem.mp-1"), &mut host);
    st.settle(&mut host, u64::MAX);
    assert_eq!(st.failures.len(), 1);
    let f = &st.failures.all()[0];
    assert_eq!(f.pid, 20);
    assert!(f.removed_by.is_none());
    assert_eq!((&f.why, &f.removed_by), (&Cause::SegmentGone, &None));
}

#[test]
fn a_lookup_followed_by_creating_the_name_is_withdrawn() {
    let (mut st, mut host, mut s) = setup();
    st.apply(&gone(&mut s, 20, "/dev/shm/psm_1"), &mut host);
    st.apply(
        &Event::Opened {
            h: s.h(20, 1),
            syscall: Syscall::Openat,
            fd: Some(5),
            flags: libc::O_CREAT as u64,
            file: file(100, "psm_1", 0, 0, 0),
        },
        &mut host,
    );
    // Another process's lookup of the same name still counts.
    st.apply(&gone(&mut s, 21, "/dev/shm/psm_2"), &mut host);
    st.settle(&mut host, u64::MAX);
    assert_eq!(st.failures.len(), 1);
    assert_eq!(st.failures.all()[0].pid, 21);
}

#[test]
fn a_removal_after_the_open_does_not_explain_it() {
    let (mut st, mut host, mut s) = setup();
    st.apply(&gone(&mut s, 20, "/dev/shm/x"), &mut host);
    st.apply(&unlink(&mut s, 77, "rm", "/dev/shm/x"), &mut host);
    st.settle(&mut host, u64::MAX);
    assert!(st.failures.all()[0].removed_by.is_none());
}

#[test]
fn the_libraries_of_a_consumer_are_read_before_the_grace_not_after() {
    let (mut st, mut host, mut s) = setup();
    host.maps.insert(
        20,
        vec![crate::host::MapsEntry {
            start: Addr(0x1000),
            end: Addr(0x2000),
            file_offset: 0,
            dev: Dev::new(8, 1),
            ino: 1,
            name: Some("libtorch_cpu.so".into()),
        }],
    );
    let ev = gone(&mut s, 20, "/dev/shm/torch_5_1");
    let at = ev.header().ts_ns;
    st.apply(&ev, &mut host);
    // The consumer dies of its RuntimeError during the grace.
    host.maps.remove(&20);
    st.settle(&mut host, at + MISSING_GRACE_NS);
    assert_eq!(st.failures.all()[0].libraries, vec!["libtorch"]);
}
