//! `--events`: every typed event as one JSON object per line. `ts_ns` is
//! CLOCK_MONOTONIC; `time` is seconds since shmtrace started.

use serde_json::{Map, Value, json};

use crate::{
    event::{Event, FailedCall, FileRef, Handler},
    signals,
};

pub fn to_json(ev: &Event, start_ns: u64) -> Value {
    let h = ev.header();
    let mut o = Map::new();
    let mut put = |k: &str, v: Value| {
        o.insert(k.to_string(), v);
    };
    put("ts_ns", json!(h.ts_ns));
    put("time", json!(h.ts_ns.saturating_sub(start_ns) as f64 / 1e9));
    put("event", json!(ev.name()));
    put("pid", json!(h.pid));
    put("tid", json!(h.tid));
    put("ppid", json!(h.ppid));
    put("comm", json!(h.comm));
    put("mnt_ns", json!(h.mnt_ns));
    put("cgroup_id", json!(h.cgroup_id));
    put("memcg_id", json!(h.memcg_id));
    match ev {
        Event::Fork { child, .. } => put("child_pid", json!(child)),
        Event::Exec {
            filename, old_pid, ..
        } => {
            put("filename", json!(filename));
            put("old_pid", json!(old_pid));
        }
        Event::Exit { status, .. } => {
            put("exit_code", json!(status.code.unwrap_or(0)));
            put("signal", json!(status.signal));
            put("signal_name", json!(status.signal.map(signals::describe)));
            put("core_dumped", json!(status.core_dumped));
        }
        Event::Sigbus {
            target,
            target_tid,
            si_code,
            si_errno,
            addr,
            ..
        } => {
            put("signal", json!(libc::SIGBUS));
            put("si_code", json!(si_code));
            put("si_code_name", json!(signals::sigbus_code_name(*si_code)));
            put("si_addr", json!(addr.to_string()));
            put("si_errno", json!(si_errno));
            put("target_pid", json!(target));
            put("target_tid", json!(target_tid));
        }
        Event::SigbusDelivered {
            si_code, handler, ..
        } => {
            put("signal", json!(libc::SIGBUS));
            put("si_code", json!(si_code));
            put(
                "handler",
                json!(match handler {
                    Handler::Default => "default".to_string(),
                    Handler::Ignore => "ignore".to_string(),
                    Handler::Function(f) => format!("{f:#x}"),
                }),
            );
        }
        Event::SyscallFailed { errno, call, .. } => {
            put("syscall", json!(call.syscall().name()));
            put("errno", json!(errno));
            put(
                "errno_name",
                json!(signals::ErrnoName::of(*errno).to_string()),
            );
            match call {
                FailedCall::Open { path, dirfd, .. } => {
                    put("path", json!(crate::escape::str(path)));
                    put("dirfd", json!(dirfd));
                }
                FailedCall::Mremap {
                    old_addr,
                    old_len,
                    new_len,
                } => {
                    put("old_addr", json!(old_addr.to_string()));
                    put("old_len", json!(old_len));
                    put("new_len", json!(new_len));
                }
                FailedCall::OnFile {
                    fd, offset, bytes, ..
                } => {
                    put("fd", json!(fd));
                    put("offset", json!(offset));
                    put("bytes", json!(bytes));
                }
            }
        }
        Event::Mapped {
            addr,
            len,
            prot,
            flags,
            offset,
            ..
        } => {
            put("addr", json!(addr.to_string()));
            put("len", json!(len));
            put("prot", json!(prot));
            put("flags", json!(flags));
            put("offset", json!(offset));
        }
        Event::Remapped {
            old_addr,
            old_len,
            new_addr,
            new_len,
            ..
        } => {
            put("old_addr", json!(old_addr.to_string()));
            put("old_len", json!(old_len));
            put("new_len", json!(new_len));
            put("new_addr", json!(new_addr.to_string()));
        }
        Event::OomVictim {
            victim, shmem_rss, ..
        } => {
            put("victim_pid", json!(victim));
            put("shmem_rss_bytes", json!(shmem_rss));
        }
        Event::Opened { syscall, fd, .. } => {
            put("syscall", json!(syscall.name()));
            put("fd", json!(fd));
        }
        Event::FdsReceived { control_bytes, .. } => put("control_bytes", json!(control_bytes)),
        Event::Unlinked {
            path,
            dirfd,
            dir_dev,
            ..
        } => {
            put("path", json!(crate::escape::str(path)));
            put("dirfd", json!(dirfd));
            put("dir_dev", json!(dir_dev.map(|d| d.to_string())));
        }
        Event::CudaIpcFailed { call, code, .. } => {
            put("call", json!(call.name()));
            put("code", json!(code));
            put("error", json!(call.error_name(*code)));
        }
        Event::Truncated { fd, length, .. } => {
            put("fd", json!(fd));
            put("length", json!(length));
        }
    }
    if let Some(f) = ev.file() {
        put("file", file_json(f));
    }
    Value::Object(o)
}

fn file_json(f: &FileRef) -> Value {
    json!({
        "dev": f.dev.to_string(),
        "ino": f.ino,
        "name": f.name,
        "size": f.size,
        "allocated_bytes": f.allocated,
        "unlinked": f.unlinked,
        "mount_size_bytes": f.mount.max_pages * 4096,
        "mount_used_bytes": f.mount.used_pages * 4096,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Addr, Header};

    #[test]
    fn one_object_per_event_with_escaped_strings() {
        let ev = Event::Sigbus {
            h: Header {
                ts_ns: 2_500_000_000,
                pid: 4,
                tid: 5,
                comm: "ev\\x0ail".into(),
                ..Default::default()
            },
            target: 4,
            target_tid: 5,
            si_code: 2,
            si_errno: 0,
            addr: Addr(0x1000),
            mount: None,
        };
        let v = to_json(&ev, 500_000_000);
        assert_eq!(v["event"], "signal_generate");
        assert_eq!(v["time"], 2.0);
        assert_eq!(v["si_code_name"], "BUS_ADRERR");
        assert_eq!(v["si_addr"], "0x1000");
        assert_eq!(v["comm"], "ev\\x0ail");
    }
}
