//! Decoding the kernel's records, and their one-line JSON form (`--events`).

use serde_json::{Value, json};
use shmtrace_common::{Event, EventKind};

use crate::{escape, mounts::kdev_string, offsets::syscall_name, signals};

/// Copies a record out of a ring buffer sample.
pub fn decode(bytes: &[u8]) -> Option<Event> {
    if bytes.len() < Event::SIZE {
        return None;
    }
    // SAFETY: Event is plain old data and the slice is long enough.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Event>()) })
}

pub fn kind(ev: &Event) -> Option<EventKind> {
    EventKind::from_u32(ev.kind)
}

pub fn kind_name(k: EventKind) -> &'static str {
    match k {
        EventKind::Fork => "fork",
        EventKind::Exec => "exec",
        EventKind::Exit => "exit",
        EventKind::SignalGenerate => "signal_generate",
        EventKind::SignalDeliver => "signal_deliver",
        EventKind::SyscallFail => "syscall_error",
        EventKind::Map => "mmap",
        EventKind::Unmap => "munmap",
        EventKind::Remap => "mremap",
        EventKind::OomVictim => "oom_victim",
        EventKind::Truncate => "ftruncate",
        EventKind::Open => "open",
        EventKind::Close => "close",
        EventKind::RecvFds => "recvmsg_fds",
    }
}

/// The file a record names, as "name" or "parent/name" (escaped).
pub fn file_name(ev: &Event) -> Option<String> {
    if ev.file.valid == 0 {
        return None;
    }
    let name = escape::bytes(&ev.file.name);
    Some(if ev.file.depth == 2 {
        format!("{}/{name}", escape::bytes(&ev.file.parent))
    } else if ev.file.depth == 1 {
        name
    } else {
        format!(".../{}/{name}", escape::bytes(&ev.file.parent))
    })
}

/// One JSON object for `--events`. `ts_ns` is CLOCK_MONOTONIC; `time` is
/// seconds since shmtrace started.
pub fn to_json(ev: &Event, start_ns: u64) -> Value {
    let k = kind(ev);
    let mut v = json!({
        "ts_ns": ev.ts_ns,
        "time": (ev.ts_ns.saturating_sub(start_ns)) as f64 / 1e9,
        "event": k.map(kind_name).unwrap_or("unknown"),
        "pid": ev.tgid,
        "tid": ev.tid,
        "ppid": ev.ppid,
        "comm": escape::bytes(&ev.comm),
        "mnt_ns": ev.mnt_ns,
        "cgroup_id": ev.cgroup_id,
    });
    let o = v.as_object_mut().expect("object");
    let a = ev.args;
    match k {
        Some(EventKind::Fork) => {
            o.insert("child_pid".into(), json!(a[0]));
        }
        Some(EventKind::Exec) => {
            o.insert("filename".into(), json!(escape::bytes(&ev.path)));
            o.insert("old_pid".into(), json!(a[0]));
        }
        Some(EventKind::Exit) => {
            let code = ev.ret as i32;
            o.insert("exit_code".into(), json!((code >> 8) & 0xff));
            let sig = code & 0x7f;
            o.insert(
                "signal".into(),
                if sig != 0 { json!(sig) } else { Value::Null },
            );
            o.insert(
                "signal_name".into(),
                if sig != 0 {
                    json!(signals::describe(sig))
                } else {
                    Value::Null
                },
            );
            o.insert("core_dumped".into(), json!(code & 0x80 != 0));
        }
        Some(EventKind::SignalGenerate) => {
            o.insert("signal".into(), json!(a[0]));
            o.insert("si_code".into(), json!(a[1] as i64));
            o.insert(
                "si_code_name".into(),
                json!(signals::sigbus_code_name(a[1] as i64 as i32)),
            );
            o.insert("si_addr".into(), json!(format!("{:#x}", a[2])));
            o.insert("si_errno".into(), json!(ev.ret));
            o.insert("target_pid".into(), json!(a[3]));
            o.insert("target_tid".into(), json!(a[4]));
            o.insert("result".into(), json!(a[5] & 0xffff_ffff));
            o.insert("group".into(), json!(a[5] >> 32 != 0));
        }
        Some(EventKind::SignalDeliver) => {
            o.insert("signal".into(), json!(a[0]));
            o.insert("si_code".into(), json!(a[1] as i64));
            o.insert(
                "handler".into(),
                json!(match a[2] {
                    0 => "default".to_string(),
                    1 => "ignore".to_string(),
                    h => format!("{h:#x}"),
                }),
            );
        }
        Some(EventKind::SyscallFail) => {
            o.insert("syscall".into(), json!(syscall_name(ev.syscall)));
            o.insert("errno".into(), json!(-ev.ret));
            o.insert(
                "errno_name".into(),
                json!(signals::errno_name(-ev.ret as i32)),
            );
            o.insert("args".into(), json!(a));
            if ev.path[0] != 0 {
                o.insert("path".into(), json!(escape::bytes(&ev.path)));
            }
        }
        Some(EventKind::Map) => {
            o.insert("addr".into(), json!(format!("{:#x}", ev.ret)));
            o.insert("len".into(), json!(a[1]));
            o.insert("prot".into(), json!(a[2]));
            o.insert("flags".into(), json!(a[3]));
            o.insert("offset".into(), json!(a[5]));
        }
        Some(EventKind::Unmap) => {
            o.insert("addr".into(), json!(format!("{:#x}", a[0])));
            o.insert("len".into(), json!(a[1]));
        }
        Some(EventKind::Remap) => {
            o.insert("old_addr".into(), json!(format!("{:#x}", a[0])));
            o.insert("old_len".into(), json!(a[1]));
            o.insert("new_len".into(), json!(a[2]));
            o.insert("new_addr".into(), json!(format!("{:#x}", ev.ret)));
        }
        Some(EventKind::OomVictim) => {
            o.insert("victim_pid".into(), json!(a[0]));
            o.insert("shmem_rss_bytes".into(), json!(a[1] * 1024));
        }
        Some(EventKind::Open) => {
            o.insert("syscall".into(), json!(syscall_name(ev.syscall)));
            o.insert("fd".into(), json!(ev.ret));
        }
        Some(EventKind::Close) => {
            o.insert("fd".into(), json!(a[0]));
        }
        Some(EventKind::RecvFds) => {
            o.insert("control_bytes".into(), json!(a[0]));
        }
        Some(EventKind::Truncate) => {
            o.insert("fd".into(), json!(a[0]));
            o.insert("length".into(), json!(a[1]));
        }
        None => {}
    }
    if ev.file.valid != 0 {
        o.insert(
            "file".into(),
            json!({
                "dev": kdev_string(ev.file.dev),
                "ino": ev.file.ino,
                "name": file_name(ev),
                "size": ev.file.size,
                "allocated_bytes": ev.file.blocks * 512,
                "unlinked": ev.file.nlink == 0,
                "mount_size_bytes": ev.file.fs_max_pages * 4096,
                "mount_used_bytes": ev.file.fs_used_pages.max(0) as u64 * 4096,
            }),
        );
    }
    v
}
