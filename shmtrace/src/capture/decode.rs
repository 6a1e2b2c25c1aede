//! The one place that reads wire records: bytes from a ring buffer become a
//! typed [`Event`], every `args[i]` interpreted here and nowhere else.

use shmtrace_common::{self as wire, EventKind, SyscallNrs};

use crate::{
    escape,
    event::KernelLimits,
    event::{
        Addr, Dev, Event, ExitStatus, FailedCall, FileRef, Handler, Header, MountPages, Syscall,
    },
};

const O_CREAT: u64 = libc::O_CREAT as u64;

/// Turns wire records into typed events. Holds this architecture's syscall
/// numbers (the same table the programs were given).
#[derive(Clone, Copy, Debug)]
pub struct Decoder {
    nrs: SyscallNrs,
}

/// Why a record could not be decoded (counted, never fatal).
#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    Short(usize),
    UnknownKind(u32),
    UnknownSyscall(u32),
    /// A record that must name a tmpfs file came without one.
    NoFile,
}

impl Decoder {
    pub fn new(nrs: SyscallNrs) -> Self {
        Self { nrs }
    }

    /// This machine's syscall numbers.
    pub fn native() -> Self {
        Self::new(super::offsets::syscall_nrs())
    }

    /// Copies a record out of ring buffer bytes.
    pub fn raw(bytes: &[u8]) -> Result<wire::Event, DecodeError> {
        if bytes.len() < wire::Event::SIZE {
            return Err(DecodeError::Short(bytes.len()));
        }
        // Plain old data (bytemuck checks at compile time that any bit
        // pattern is valid); ring bytes need not be aligned.
        Ok(bytemuck::pod_read_unaligned(&bytes[..wire::Event::SIZE]))
    }

    pub fn decode(&self, bytes: &[u8]) -> Result<Event, DecodeError> {
        self.typed(&Self::raw(bytes)?)
    }

    pub fn syscall(&self, nr: u32) -> Option<Syscall> {
        let n = &self.nrs;
        Some(match nr {
            x if x == n.write => Syscall::Write,
            x if x == n.pwrite64 => Syscall::Pwrite64,
            x if x == n.writev => Syscall::Writev,
            x if x == n.pwritev => Syscall::Pwritev,
            x if x == n.pwritev2 => Syscall::Pwritev2,
            x if x == n.fallocate => Syscall::Fallocate,
            x if x == n.ftruncate => Syscall::Ftruncate,
            x if x == n.open => Syscall::Open,
            x if x == n.openat => Syscall::Openat,
            x if x == n.openat2 => Syscall::Openat2,
            x if x == n.creat => Syscall::Creat,
            x if x == n.mmap => Syscall::Mmap,
            x if x == n.mremap => Syscall::Mremap,
            x if x == n.recvmsg => Syscall::Recvmsg,
            x if x == n.sendfile => Syscall::Sendfile,
            x if x == n.splice => Syscall::Splice,
            x if x == n.copy_file_range => Syscall::CopyFileRange,
            _ => return None,
        })
    }

    /// A wire record as a typed event.
    pub fn typed(&self, ev: &wire::Event) -> Result<Event, DecodeError> {
        let kind = EventKind::from_u32(ev.kind).ok_or(DecodeError::UnknownKind(ev.kind))?;
        let h = header(ev);
        let a = ev.args;
        let sys = || {
            self.syscall(ev.syscall)
                .ok_or(DecodeError::UnknownSyscall(ev.syscall))
        };
        Ok(match kind {
            EventKind::Fork => Event::Fork {
                h,
                child: a[0] as u32,
            },
            EventKind::Exec => Event::Exec {
                h,
                filename: escape::bytes(&ev.path),
                old_pid: a[0] as u32,
            },
            EventKind::Exit => Event::Exit {
                h,
                status: ExitStatus::from_kernel(ev.ret as i32),
            },
            EventKind::SignalGenerate => Event::Sigbus {
                h,
                target: a[3] as u32,
                target_tid: a[4] as u32,
                si_code: a[1] as i64 as i32,
                si_errno: ev.ret as i32,
                addr: Addr(a[2]),
                mount: mount_pages(&ev.file),
            },
            EventKind::SignalDeliver => Event::SigbusDelivered {
                h,
                si_code: a[1] as i64 as i32,
                handler: match a[2] {
                    0 => Handler::Default,
                    1 => Handler::Ignore,
                    f => Handler::Function(f),
                },
            },
            EventKind::SyscallFail => Event::SyscallFailed {
                h,
                errno: (-ev.ret) as i32,
                call: self.failed_call(sys()?, ev)?,
                limits: limits(&ev.limits),
                mnt_flags: ev.limits.mnt_flags,
            },
            EventKind::Map => Event::Mapped {
                h,
                addr: Addr(ev.ret as u64),
                len: a[1],
                prot: a[2],
                flags: a[3],
                offset: a[5],
                file: file_ref(&ev.file).ok_or(DecodeError::NoFile)?,
                mountpoint: mountpoint(&ev.path),
            },
            EventKind::Remap => Event::Remapped {
                h,
                old_addr: Addr(a[0]),
                old_len: a[1],
                new_addr: Addr(ev.ret as u64),
                new_len: a[2],
            },
            EventKind::Unlink => Event::Unlinked {
                h,
                path: lossy(&ev.path),
                dirfd: (a[0] as i32 != libc::AT_FDCWD).then_some(a[0] as i32),
                dir_dev: (ev.file.dev != 0).then_some(Dev(ev.file.dev)),
            },
            EventKind::CudaIpc => Event::CudaIpcFailed {
                h,
                call: crate::event::CudaCall::from_wire(a[0])
                    .ok_or(DecodeError::UnknownKind(ev.kind))?,
                code: ev.ret as i32,
            },
            EventKind::OomVictim => Event::OomVictim {
                h,
                victim: a[0] as u32,
                shmem_rss: a[1] * 1024,
            },
            EventKind::Truncate => Event::Truncated {
                h,
                fd: a[0] as i32,
                length: a[1],
                file: file_ref(&ev.file).ok_or(DecodeError::NoFile)?,
            },
            EventKind::Open => {
                let syscall = sys()?;
                let flags = match syscall {
                    Syscall::Openat => a[2],
                    Syscall::Creat => O_CREAT,
                    _ => a[1],
                };
                Event::Opened {
                    h,
                    syscall,
                    fd: (ev.ret >= 0).then_some(ev.ret as i32),
                    flags,
                    file: file_ref(&ev.file).ok_or(DecodeError::NoFile)?,
                }
            }
            EventKind::RecvFds => Event::FdsReceived {
                h,
                control_bytes: a[0],
            },
        })
    }

    fn failed_call(&self, syscall: Syscall, ev: &wire::Event) -> Result<FailedCall, DecodeError> {
        let a = ev.args;
        Ok(match syscall {
            Syscall::Open | Syscall::Openat | Syscall::Openat2 | Syscall::Creat => {
                let at = matches!(syscall, Syscall::Openat | Syscall::Openat2);
                let dirfd = a[0] as i32;
                FailedCall::Open {
                    syscall,
                    dirfd: (at && dirfd != libc::AT_FDCWD).then_some(dirfd),
                    path: lossy(&ev.path),
                }
            }
            Syscall::Mremap => FailedCall::Mremap {
                old_addr: Addr(a[0]),
                old_len: a[1],
                new_len: a[2],
            },
            _ => {
                let (fd, offset, bytes) = match syscall {
                    Syscall::Fallocate => (a[0], Some(a[2]), Some(a[3])),
                    // write/writev: the programs put the fd's position in args[3].
                    Syscall::Write | Syscall::Pwrite64 => (a[0], Some(a[3]), Some(a[2])),
                    Syscall::Writev | Syscall::Pwritev | Syscall::Pwritev2 => {
                        (a[0], Some(a[3]), None)
                    }
                    Syscall::Ftruncate => (a[0], None, Some(a[1])),
                    Syscall::Mmap => (a[4], Some(a[5]), Some(a[1])),
                    // Into the tmpfs fd: sendfile(out, in, off, count),
                    // splice/copy_file_range(in, off_in, out, off_out, len, ..).
                    Syscall::Sendfile => (a[0], None, Some(a[3])),
                    Syscall::Splice | Syscall::CopyFileRange => (a[2], None, Some(a[4])),
                    _ => (a[0], None, None),
                };
                FailedCall::OnFile {
                    syscall,
                    fd: fd as i32,
                    offset,
                    bytes,
                    prot: (syscall == Syscall::Mmap).then_some(a[2]),
                    mountpoint: mountpoint(&ev.path),
                    file: file_ref(&ev.file).ok_or(DecodeError::NoFile)?,
                }
            }
        })
    }
}

fn header(ev: &wire::Event) -> Header {
    Header {
        ts_ns: ev.ts_ns,
        pid: ev.tgid,
        tid: ev.tid,
        ppid: ev.ppid,
        ns_pid: ev.ns_tgid,
        mnt_ns: ev.mnt_ns,
        cgroup_id: ev.cgroup_id,
        memcg_id: ev.memcg_id,
        comm: escape::bytes(&ev.comm),
    }
}

fn mount_pages(f: &wire::FileInfo) -> Option<MountPages> {
    (f.dev != 0).then(|| MountPages {
        dev: Dev(f.dev),
        max_pages: f.fs_max_pages,
        used_pages: f.fs_used_pages.max(0) as u64,
    })
}

/// The file part of a record, when the programs filled it (a tmpfs fd).
/// "/dev/shm" from the names the kernel wrote leaf first ("shm", "dev").
fn mountpoint(path: &[u8; wire::PATH_LEN]) -> Option<String> {
    let names: Vec<String> = path
        .chunks(wire::MOUNTPOINT_NAME_LEN)
        .take_while(|c| c[0] != 0)
        .map(crate::escape::bytes)
        .collect();
    if names.is_empty() {
        return None;
    }
    Some(
        names
            .iter()
            .rev()
            .fold(String::new(), |p, n| format!("{p}/{n}")),
    )
}

fn limits(l: &wire::ProcLimits) -> Option<KernelLimits> {
    let finite = |v: u64| (v != u64::MAX).then_some(v);
    (l.valid != 0).then(|| KernelLimits {
        address_space: finite(l.rlim_as),
        file_size: finite(l.rlim_fsize),
        open_files: finite(l.rlim_nofile),
        vm_bytes: l.total_vm_pages * 4096,
        map_count: l.map_count as u64,
    })
}

fn file_ref(f: &wire::FileInfo) -> Option<FileRef> {
    if f.valid == 0 {
        return None;
    }
    let name = escape::bytes(&f.name);
    let name = match f.depth {
        1 => name,
        2 => format!("{}/{name}", escape::bytes(&f.parent)),
        _ => format!(".../{}/{name}", escape::bytes(&f.parent)),
    };
    Some(FileRef {
        dev: Dev(f.dev),
        ino: f.ino,
        name: Some(name),
        size: f.size,
        allocated: f.blocks * 512,
        unlinked: f.nlink == 0,
        mount: MountPages {
            dev: Dev(f.dev),
            max_pages: f.fs_max_pages,
            used_pages: f.fs_used_pages.max(0) as u64,
        },
    })
}

fn lossy(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// Builds wire records for tests (the programs' side of the contract).
#[cfg(test)]
pub mod wire_builder {
    use super::*;

    pub fn nrs() -> SyscallNrs {
        super::super::offsets::syscall_nrs()
    }

    pub fn record(kind: EventKind, tgid: u32) -> wire::Event {
        let mut e: wire::Event = bytemuck::Zeroable::zeroed();
        e.kind = kind as u32;
        e.tgid = tgid;
        e.tid = tgid;
        e.ts_ns = 1_000;
        e.comm[..4].copy_from_slice(b"test");
        e
    }

    pub fn to_bytes(e: &wire::Event) -> Vec<u8> {
        bytemuck::bytes_of(e).to_vec()
    }
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
