//! Classification: which records are shared-memory failures, and the
//! evidence each carries. A failure is a shm failure only when the kernel
//! saw a tmpfs fd, the fault address is in a tmpfs mapping, or an open path
//! lies on a tmpfs mount; everything else is kept aside or dropped.

use super::{
    State,
    causes::{self, Call, Cause, Reason},
    failures::{FailureKind, MountAtFailure, NotShm, Op, OtherSignal},
    mappings::Mapping,
};
use crate::{
    event::{Event, FailedCall, Syscall},
    host::Host,
    signals,
    units::page_size,
};

const BUS_ADRERR: i32 = 2;
const BUS_MCEERR_AR: i32 = 4;
const BUS_MCEERR_AO: i32 = 5;
const EFBIG: i32 = libc::EFBIG;
const ENOMEM: i32 = libc::ENOMEM;

impl State {
    pub(super) fn on_sigbus(&mut self, ev: &Event, host: &mut dyn Host) {
        let Event::Sigbus {
            h,
            target,
            target_tid,
            si_code: code,
            addr,
            mount,
            ..
        } = ev
        else {
            return;
        };
        let (target, target_tid, code, addr) = (*target, *target_tid, *code, *addr);
        let other = |reason| OtherSignal {
            ts_ns: h.ts_ns,
            pid: target,
            tid: target_tid,
            sender_pid: h.pid,
            si_code: code,
            si_code_name: signals::sigbus_code_name(code),
            fault_addr: addr,
            reason,
            count: 1,
            last_ts_ns: h.ts_ns,
        };
        if code <= 0 {
            // Sent by a process, not by a fault: a handler re-raising it
            // (PyTorch's worker handler does) or kill -BUS.
            if h.pid == target {
                self.procs.reraised_sigbus(target);
                self.failures.not_shm(other(NotShm::RaisedBySelf));
            } else {
                self.failures.not_shm(other(NotShm::SentByOther));
            }
            return;
        }
        // A handler that returns (Rust's runtime installs one) makes the
        // same access fault again: one failure, counted, not collateral.
        if self.failures.refaulted(target_tid, addr) {
            return;
        }
        // A range unmapped since the last tick (munmap is not hooked) must
        // not stand for what is mapped there now.
        self.check_mappings_of(host, target);
        let mapping = self.maps.find(target, addr).cloned().or_else(|| {
            // Mapped before we saw it (or the event was lost): ask /proc.
            host.maps(target)
                .into_iter()
                .filter(|m| self.mounts.by_dev(m.dev).is_some_and(|t| t.is_tmpfs()))
                .find(|m| m.start <= addr && addr < m.end)
                .map(Mapping::from)
        });
        let Some(m) = mapping else {
            self.failures.not_shm(other(NotShm::NotTmpfsMapping));
            return;
        };
        let offset = m.offset_of(addr);
        // The file's size now: from the process's map_files link while it
        // lives, else the last ftruncate we saw, else the size when mapped.
        let size = host
            .stat_map_range(target, m.start, m.end)
            .filter(|st| st.ino == m.ino)
            .map(|st| st.size)
            .or_else(|| self.sizes.get(&(m.dev, m.ino)).copied())
            .unwrap_or(m.size);
        if size >= 0 && offset >= size as u64 {
            self.failures.not_shm(other(NotShm::PastEnd));
            return;
        }
        let at = self.mount_state(host, m.dev, h.mnt_ns, target, *mount);
        let reason = match code {
            BUS_ADRERR => Reason::TmpfsFull,
            BUS_MCEERR_AR | BUS_MCEERR_AO => Reason::HardwareError,
            _ => Reason::Other,
        };
        let cause = if code == BUS_ADRERR {
            match at
                .as_ref()
                .and_then(|u| Some((u.free_bytes?, u.size_bytes?)))
            {
                Some((free, size)) if free < page_size() * 64 || free * 100 < size => {
                    Cause::PageFull
                }
                Some(_) => Cause::PageFreedSince,
                None => Cause::PageUnknown,
            }
        } else {
            Cause::SigbusCode(code)
        };
        let path = self.file_path(host, m.dev, m.name.as_deref(), h);
        let mut f = self.base_failure(FailureKind::Sigbus, h, target, target_tid);
        f.signal = Some(libc::SIGBUS);
        f.si_code = Some(code);
        f.si_code_name = Some(signals::sigbus_code_name(code));
        f.fault_addr = Some(addr);
        f.path = path;
        f.dev = Some(m.dev);
        f.ino = Some(m.ino);
        f.offset = Some(offset);
        f.bytes = Some(page_size());
        f.file_size = (size >= 0).then_some(size);
        f.why = cause;
        f.reason = reason;
        f.mount = at;
        self.record(host, f);
    }

    pub(super) fn on_syscall_failure(&mut self, ev: &Event, host: &mut dyn Host) {
        let Event::SyscallFailed {
            h,
            errno,
            call,
            limits: at_failure,
            mnt_flags,
        } = ev
        else {
            return;
        };
        let errno = *errno;
        let errno_kind = FailureKind::of_errno(errno);
        // Limits are read only for the errnos whose cause they tell.
        // What the kernel read at the failure wins; /proc adds the rest
        // (while the process lives).
        let limits = match errno {
            ENOMEM | EFBIG | libc::EMFILE => {
                let mut l = host.limits(h.pid);
                if let Some(k) = at_failure {
                    l.address_space = k.address_space;
                    l.file_size = k.file_size;
                    l.open_files = k.open_files;
                    l.vm_bytes = Some(k.vm_bytes).filter(|&v| v > 0).or(l.vm_bytes);
                    l.map_count = Some(k.map_count).filter(|&v| v > 0).or(l.map_count);
                }
                l
            }
            _ => Default::default(),
        };
        let explain =
            |syscall, prot, bytes, offset, memfd, noexec, mount: Option<&MountAtFailure>| {
                causes::explain(&Call {
                    syscall,
                    errno,
                    prot,
                    bytes,
                    offset,
                    memfd,
                    noexec,
                    free_bytes: mount.and_then(|m| m.free_bytes),
                    inodes_free: mount.and_then(|m| Some(m.inodes?.saturating_sub(m.inodes_used?))),
                    inodes: mount.and_then(|m| m.inodes),
                    limits: &limits,
                })
            };
        let mut f = self.base_failure(errno_kind, h, h.pid, h.tid);
        f.syscall = Some(Op::Syscall(call.syscall()));
        f.errno = Some(errno);
        f.errno_name = Some(signals::ErrnoName::of(errno));
        match call {
            FailedCall::Open { dirfd, path, .. } => {
                let raw = path;
                if errno == libc::ENOENT && super::missing::is_lookup(raw, &h.comm) {
                    return;
                }
                let Some((path, mount)) = self.resolve_open_path(host, h, *dirfd, path) else {
                    return; // not under a tmpfs mount: not a shm failure
                };
                f.path = Some(path);
                f.dev = Some(mount);
                f.mount = self.mount_state(host, mount, h.mnt_ns, h.pid, None);
                if errno == libc::ENOENT {
                    self.on_missing(host, f, raw);
                    return;
                }
                let x = explain(
                    call.syscall(),
                    None,
                    None,
                    None,
                    false,
                    false,
                    f.mount.as_ref(),
                );
                (f.why, f.reason, f.limit) = (x.cause, x.reason, x.limit);
            }
            FailedCall::Mremap {
                old_addr,
                old_len,
                new_len,
            } => {
                let Some(m) = self.maps.find(h.pid, *old_addr).cloned() else {
                    return;
                };
                f.kind = FailureKind::MremapError;
                f.path = self.file_path(host, m.dev, m.name.as_deref(), h);
                f.dev = Some(m.dev);
                f.ino = Some(m.ino);
                f.offset = Some(m.offset_of(*old_addr));
                f.bytes = Some(*new_len);
                f.mount = self.mount_state(host, m.dev, h.mnt_ns, h.pid, None);
                let grow = new_len.saturating_sub(*old_len);
                let x = explain(
                    Syscall::Mremap,
                    None,
                    Some(grow),
                    None,
                    false,
                    false,
                    f.mount.as_ref(),
                );
                (f.why, f.reason, f.limit) = (x.cause, x.reason, x.limit);
            }
            FailedCall::OnFile {
                syscall,
                offset,
                bytes,
                prot,
                mountpoint,
                file,
                ..
            } => {
                if *syscall == Syscall::Mmap {
                    f.kind = FailureKind::MmapError;
                }
                self.ensure_mount(host, file.dev, h.mnt_ns, h.pid);
                f.path = self.file_path(host, file.dev, file.name.as_deref(), h);
                f.dev = Some(file.dev);
                f.ino = Some(file.ino);
                f.offset = *offset;
                f.bytes = *bytes;
                f.file_size = Some(file.size);
                f.unlinked = Some(file.unlinked);
                f.mount = self.mount_state(host, file.dev, h.mnt_ns, h.pid, Some(file.mount));
                // The namespace's mount table was out of reach (a job gone
                // in milliseconds): the mount point the kernel read.
                if let (Some(mp), Some(name)) = (mountpoint, file.name.as_deref())
                    && self.mounts.by_dev(file.dev).is_none()
                {
                    f.path = Some(format!("{mp}/{name}"));
                    if let Some(m) = f.mount.as_mut() {
                        m.mountpoint.get_or_insert_with(|| mp.clone());
                    }
                }
                if let (Some(hm), Some(name)) = (
                    f.mount.as_ref().and_then(|m| m.host_mountpoint.as_ref()),
                    file.name.as_deref(),
                ) {
                    f.host_path = Some(format!("{hm}/{name}"));
                }
                // memfd_create names its files "memfd:NAME"; noexec from the
                // kernel's view of the fd's mount, else the mount table.
                let memfd = file
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("memfd:"));
                let noexec = *mnt_flags & crate::event::MNT_NOEXEC != 0
                    || self.mounts.by_dev(file.dev).is_some_and(|m| m.noexec);
                let x = explain(
                    *syscall,
                    *prot,
                    *bytes,
                    *offset,
                    memfd,
                    noexec,
                    f.mount.as_ref(),
                );
                (f.why, f.reason, f.limit) = (x.cause, x.reason, x.limit);
            }
        }
        self.record(host, f);
    }

    pub(super) fn on_oom(&mut self, ev: &Event, host: &mut dyn Host) {
        let Event::OomVictim {
            h,
            victim,
            shmem_rss,
        } = ev
        else {
            return;
        };
        let mut f = self.base_failure(FailureKind::OomKill, h, *victim, *victim);
        f.bytes = (*shmem_rss > 0).then_some(*shmem_rss);
        // Read now: the victim is on its way out.
        f.kernel_oom = host.kernel_oom(*victim);
        f.memcg = self.memcg_now(host, *victim);
        if f.memcg.as_ref().is_none_or(|m| m.path == "/") {
            // Gone already (it shows the root): the cgroup its events came
            // from while it lived.
            let id = self.procs.get(*victim).map(|p| p.cgroup_id).unwrap_or(0);
            if let Some(c) = self
                .container_of_pid(host, *victim)
                .or_else(|| self.container_of_id(host, id))
                .filter(|c| c.cgroup != "/")
                && let Some((version, _)) = f
                    .memcg
                    .as_ref()
                    .map(|m| (m.version, ()))
                    .or_else(|| host.memcg_of(std::process::id()).map(|(v, _)| (v, ())))
            {
                f.memcg = host.memcg_at(version, &c.cgroup).or(f.memcg.take());
            }
        }
        if let Some(m) = f.memcg.as_mut() {
            // Read after the kill began freeing the victim's pages: its own
            // shmem at the kill, from the kernel's record, is a floor.
            let read = m.shmem_bytes.unwrap_or(0);
            if *shmem_rss > read {
                let other = m.usage_bytes.saturating_sub(read);
                m.shmem_bytes = Some(*shmem_rss);
                m.usage_bytes = m.usage_bytes.max(other + shmem_rss);
            }
        }
        // What filled the limit: the file of the largest charge is the
        // failure's file.
        f.charged_files = self.charged_files(host, h, *victim, f.memcg.as_ref());
        if let Some(top) = f.charged_files.first().cloned() {
            f.path = top.path;
            f.dev = Some(top.dev);
            f.ino = Some(top.ino);
            f.unlinked = Some(top.unlinked);
            f.mount = self.mount_state(host, top.dev, h.mnt_ns, *victim, None);
        }
        f.why = Cause::OomKill {
            shmem_rss: *shmem_rss,
        };
        f.reason = Reason::OomKill;
        self.record(host, f);
    }

    /// A CUDA IPC call that failed: its error is about GPU memory or the
    /// IPC itself (driver, device, container isolation), whatever the
    /// framework's message says; /dev/shm has nothing to do with it.
    pub(super) fn on_cuda_ipc(&mut self, ev: &Event, host: &mut dyn Host) {
        let Event::CudaIpcFailed { h, call, code } = ev else {
            return;
        };
        let mut f = self.base_failure(FailureKind::CudaIpc, h, h.pid, h.tid);
        f.syscall = Some(Op::Cuda(*call));
        f.why = Cause::CudaIpc {
            call: *call,
            code: *code,
        };
        // The probe that fired names the library, whether or not the
        // process is still there to show its maps.
        f.libraries = self.libraries_of(host, h.pid);
        let probed = call.library();
        if !f.libraries.contains(&probed) {
            f.libraries.push(probed);
        }
        f.reason = Reason::CudaIpc;
        self.record(host, f);
    }
}
