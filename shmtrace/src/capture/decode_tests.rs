//! The decoder on hand-built wire records (`wire_builder`): each kind of
//! record becomes the typed event it describes.

use super::{wire_builder::*, *};

#[test]
fn mount_points_are_joined_leaf_last() {
    let mut p = [0u8; wire::PATH_LEN];
    p[..3].copy_from_slice(b"shm");
    p[32..35].copy_from_slice(b"dev");
    assert_eq!(mountpoint(&p).as_deref(), Some("/dev/shm"));
    p[64..68].copy_from_slice(b"a\nb\0");
    assert_eq!(mountpoint(&p).as_deref(), Some("/a\\x0ab/dev/shm"));
    assert_eq!(mountpoint(&[0u8; wire::PATH_LEN]), None);
}

#[test]
fn short_and_unknown_records_are_errors() {
    let d = Decoder::native();
    assert_eq!(d.decode(&[0u8; 10]), Err(DecodeError::Short(10)));
    let mut e = record(EventKind::Fork, 1);
    e.kind = 99;
    assert_eq!(d.decode(&to_bytes(&e)), Err(DecodeError::UnknownKind(99)));
}

#[test]
fn sigbus_fields_by_name() {
    let d = Decoder::native();
    let mut e = record(EventKind::SignalGenerate, 10);
    e.args = [7, (-2i64) as u64, 0x7f00_0000_1000, 11, 12, 0];
    e.file.dev = 40;
    e.file.fs_max_pages = 16384;
    e.file.fs_used_pages = 16380;
    let Event::Sigbus {
        h,
        target,
        target_tid,
        si_code,
        addr,
        mount,
        ..
    } = d.decode(&to_bytes(&e)).unwrap()
    else {
        panic!("not a sigbus");
    };
    assert_eq!((h.pid, h.comm.as_str()), (10, "test"));
    assert_eq!((target, target_tid, si_code), (11, 12, -2));
    assert_eq!(addr, Addr(0x7f00_0000_1000));
    let m = mount.unwrap();
    assert_eq!((m.dev, m.max_pages, m.used_pages), (Dev(40), 16384, 16380));
}

#[test]
fn failed_calls_interpret_their_arguments() {
    let d = Decoder::native();
    let n = nrs();
    let mut e = record(EventKind::SyscallFail, 5);
    e.syscall = n.fallocate;
    e.ret = -28;
    e.args = [3, 0, 4096, 1 << 20, 0, 0];
    e.file.valid = 1;
    e.file.dev = 41;
    e.file.ino = 7;
    e.file.depth = 1;
    e.file.name[..5].copy_from_slice(b"seg\n1");
    let Event::SyscallFailed { errno, call, .. } = d.decode(&to_bytes(&e)).unwrap() else {
        panic!()
    };
    assert_eq!(errno, 28);
    let FailedCall::OnFile {
        syscall,
        fd,
        offset,
        bytes,
        file,
        ..
    } = call
    else {
        panic!()
    };
    assert_eq!(syscall, Syscall::Fallocate);
    assert_eq!((fd, offset, bytes), (3, Some(4096), Some(1 << 20)));
    assert_eq!(file.name.as_deref(), Some("seg\\x0a1"), "names are escaped");

    let mut e = record(EventKind::SyscallFail, 5);
    e.syscall = n.openat;
    e.ret = -28;
    e.args[0] = libc::AT_FDCWD as i64 as u64;
    e.path[..6].copy_from_slice(b"x/y.db");
    let Event::SyscallFailed { call, .. } = d.decode(&to_bytes(&e)).unwrap() else {
        panic!()
    };
    assert_eq!(
        call,
        FailedCall::Open {
            syscall: Syscall::Openat,
            dirfd: None,
            path: "x/y.db".into()
        }
    );
}

#[test]
fn exit_status_and_nested_names() {
    let d = Decoder::native();
    let mut e = record(EventKind::Exit, 5);
    e.ret = 7 | 0x80;
    let Event::Exit { status, .. } = d.decode(&to_bytes(&e)).unwrap() else {
        panic!()
    };
    assert_eq!(
        status,
        ExitStatus {
            code: None,
            signal: Some(7),
            core_dumped: true
        }
    );
    let mut e = record(EventKind::Map, 5);
    e.syscall = nrs().mmap;
    e.ret = 0x1000;
    e.file.valid = 1;
    e.file.depth = 2;
    e.file.name[..1].copy_from_slice(b"f");
    e.file.parent[..1].copy_from_slice(b"d");
    let ev = d.decode(&to_bytes(&e)).unwrap();
    assert_eq!(ev.file().unwrap().name.as_deref(), Some("d/f"));
    assert_eq!(ev.name(), "mmap");
}
