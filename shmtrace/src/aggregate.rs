//! The aggregator: applies events in kernel-time order to the process tree
//! and mapping tables, decides which records are shared-memory failures,
//! and keeps the evidence for the report.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use shmtrace_common::{EDQUOT, EFBIG, ENOMEM, ENOSPC, Event, EventKind};

use crate::{
    attribution::{Attribution, Seen},
    containers::Containers,
    escape, events,
    mounts::{self, MountTables, Usage, kdev_string},
    offsets::syscall_name,
    procs::{self, Mapping, MappingTable, Proc},
    signals,
};

const BUS_ADRERR: i32 = 2;
const PAGE: u64 = 4096;

#[derive(Clone, Debug, Serialize)]
pub struct Ancestor {
    pub pid: u32,
    pub comm: String,
}

/// A tmpfs mount as it stood when a failure happened.
#[derive(Clone, Debug, Serialize)]
pub struct MountAtFailure {
    pub mountpoint: Option<String>,
    pub dev: String,
    pub mount_ns: u32,
    pub size_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    pub inodes: Option<u64>,
    pub inodes_used: Option<u64>,
    /// "kernel": the superblock's counters, read in the kernel at the event;
    /// "statfs": measured by user space right after it; "none": unknown.
    pub source: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    pub ts_ns: u64,
    /// Seconds since shmtrace started.
    pub time_s: f64,
    /// Nanoseconds after the first failure (0 for the first).
    pub delay_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub ppid: u32,
    pub comm: String,
    /// sigbus, enospc, edquot, efbig, enomem, mmap_error, mremap_error, oom_kill
    pub kind: &'static str,
    pub syscall: Option<&'static str>,
    pub errno: Option<i32>,
    pub errno_name: Option<&'static str>,
    pub signal: Option<i32>,
    pub si_code: Option<i32>,
    pub si_code_name: Option<&'static str>,
    pub fault_addr: Option<String>,
    pub path: Option<String>,
    pub dev: Option<String>,
    pub ino: Option<u64>,
    pub offset: Option<u64>,
    pub bytes: Option<u64>,
    pub file_size: Option<i64>,
    pub unlinked: Option<bool>,
    /// What the evidence says happened, in words.
    pub cause: String,
    pub mount: Option<MountAtFailure>,
    pub ancestry: Vec<Ancestor>,
    pub mnt_ns: u32,
    /// Times the same access faulted again after a handler returned.
    pub refaults: u32,
    /// The failing process's container (runtime, id, pod), when it is in one.
    pub container: Option<crate::containers::Container>,
    /// For the first failure on a mount: who held its bytes at that moment,
    /// and the last events on that mount before it.
    pub holders: Vec<Holder>,
    pub events_before: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Holder {
    pub pid: u32,
    pub comm: String,
    pub held_bytes: u64,
}

/// A SIGBUS that was not on a tmpfs mapping: kept, but not a shm failure.
#[derive(Clone, Debug, Serialize)]
pub struct OtherSignal {
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub sender_pid: u32,
    pub si_code: i32,
    pub si_code_name: &'static str,
    pub fault_addr: String,
    pub reason: &'static str,
}

pub struct Aggregator {
    pub start_ns: u64,
    pub procs: BTreeMap<u32, Proc>,
    maps: MappingTable,
    pub mounts: MountTables,
    pub failures: Vec<Failure>,
    pub other_signals: Vec<OtherSignal>,
    pub events_seen: u64,
    pub by_kind: HashMap<&'static str, u64>,
    /// Mounts any failure touched, by device.
    pub touched_mounts: BTreeMap<u32, MountAtFailure>,
    /// Latest known i_size of tmpfs files, by (dev, ino), from ftruncate.
    sizes: HashMap<(u32, u64), i64>,
    self_ns: u32,
    /// Who holds the bytes.
    pub attr: Attribution,
    pub containers: Containers,
    /// Every tmpfs mount holding tracked files or failures, by device.
    pub mount_stats: BTreeMap<u32, MountStat>,
    /// The last events on each tmpfs mount, by device.
    recent: HashMap<u32, std::collections::VecDeque<String>>,
    /// Node-wide: let go of mount namespaces whose processes have all been
    /// gone this long (a long-running tracer must not keep dead containers'
    /// /dev/shm alive). None: keep them until shmtrace exits.
    pub release_idle_namespaces: Option<std::time::Duration>,
    /// When each anchored namespace was last seen with a live process.
    ns_last_alive: HashMap<u32, std::time::Instant>,
    /// shmem devices found in no mount table (memfd, SysV shm).
    unmounted: std::collections::HashSet<u32>,
}

const RECENT: usize = 8;

/// A tmpfs mount's size and use, followed over time.
#[derive(Clone, Debug, Serialize)]
pub struct MountStat {
    pub mountpoint: Option<String>,
    pub dev: String,
    pub mount_ns: u32,
    pub size_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    pub peak_used_bytes: u64,
    /// Bytes of the files shmtrace tracks on it.
    pub tracked_bytes: u64,
    /// tracked_bytes / used_bytes: how much of the use is explained.
    pub explained_share: Option<f64>,
}

impl Aggregator {
    pub fn new(start_ns: u64) -> Self {
        let self_ns = mnt_ns_of("self").unwrap_or(0);
        let mut mounts = MountTables::new(self_ns);
        mounts.refresh(self_ns, std::process::id());
        Self {
            start_ns,
            procs: BTreeMap::new(),
            maps: MappingTable::default(),
            mounts,
            failures: Vec::new(),
            other_signals: Vec::new(),
            events_seen: 0,
            by_kind: HashMap::new(),
            touched_mounts: BTreeMap::new(),
            sizes: HashMap::new(),
            self_ns,
            attr: Attribution::default(),
            containers: Containers::default(),
            mount_stats: BTreeMap::new(),
            recent: HashMap::new(),
            release_idle_namespaces: None,
            ns_last_alive: HashMap::new(),
            unmounted: std::collections::HashSet::new(),
        }
    }

    /// Registers a process shmtrace was asked to trace, and what it already
    /// has mapped (for `--pid`).
    /// Returns whether it already has tmpfs mappings.
    pub fn add_root(&mut self, pid: u32, ts: u64, root: bool) -> bool {
        let (ppid, comm) = procs::read_stat(pid).unwrap_or((0, String::new()));
        let ns = mnt_ns_of(&pid.to_string()).unwrap_or(0);
        let p = self
            .procs
            .entry(pid)
            .or_insert_with(|| Proc::new(pid, ppid, ts));
        if p.comm.is_empty() {
            p.comm = comm;
        }
        p.cmdline = procs::read_cmdline(pid).or(p.cmdline.take());
        p.root = root;
        p.mnt_ns = ns;
        self.mounts.refresh(ns, pid);
        let mounts = &self.mounts;
        let found = procs::scan_maps(pid, |dev| mounts.by_dev(dev).is_some());
        let any = !found.is_empty();
        for m in found {
            self.maps.add(pid, m);
        }
        // What it holds already counts from the first screen.
        self.attr.want_rescan(pid);
        any
    }

    pub fn live_pids(&self) -> Vec<u32> {
        self.procs
            .values()
            .filter(|p| p.alive())
            .map(|p| p.pid)
            .collect()
    }

    pub fn apply(&mut self, ev: &Event) {
        self.events_seen += 1;
        let Some(kind) = events::kind(ev) else { return };
        *self.by_kind.entry(events::kind_name(kind)).or_default() += 1;
        if kind != EventKind::SignalGenerate && kind != EventKind::OomVictim {
            self.touch(ev);
            // First sight of a mount namespace: anchor it while a process
            // of it is surely alive (this one, at this event).
            if self.mounts.anchors.get(ev.mnt_ns).is_none() {
                self.mounts.refresh(ev.mnt_ns, ev.tgid);
            }
        }
        match kind {
            EventKind::Fork => {
                let child = ev.args[0] as u32;
                let mut p = Proc::new(child, ev.tgid, ev.ts_ns);
                p.comm = escape::bytes(&ev.comm);
                p.mnt_ns = ev.mnt_ns;
                p.cgroup_id = ev.cgroup_id;
                p.cmdline = self.procs.get(&ev.tgid).and_then(|pp| pp.cmdline.clone());
                self.procs.insert(child, p);
                self.maps.fork(ev.tgid, child);
                self.attr.forked(ev.tgid, child);
                self.containers.inherit(ev.tgid, child);
            }
            EventKind::Exec => {
                self.maps.clear(ev.tgid);
                if let Some(p) = self.procs.get_mut(&ev.tgid) {
                    p.cmdline =
                        procs::read_cmdline(ev.tgid).or_else(|| Some(escape::bytes(&ev.path)));
                }
                // A new program may have changed its mounts (unshare + mount).
                self.mounts.refresh(ev.mnt_ns, ev.tgid);
                self.attr.want_rescan(ev.tgid);
                self.containers.forget(ev.tgid);
                self.containers.of(ev.tgid);
            }
            EventKind::Exit => {
                let code = ev.ret as i32;
                if let Some(p) = self.procs.get_mut(&ev.tgid) {
                    p.exit_ts_ns = Some(ev.ts_ns);
                    let sig = code & 0x7f;
                    if sig != 0 {
                        p.exit_signal = Some(sig);
                    } else {
                        p.exit_code = Some((code >> 8) & 0xff);
                    }
                }
                self.maps.clear(ev.tgid);
                self.attr.gone(ev.tgid);
            }
            EventKind::Open => {
                let key = (ev.file.dev, ev.file.ino);
                let flags = if syscall_name(ev.syscall) == "openat" {
                    ev.args[2]
                } else {
                    ev.args[1]
                };
                let creat =
                    syscall_name(ev.syscall) == "creat" || flags & libc::O_CREAT as u64 != 0;
                let created = creat && ev.file.size == 0 && ev.file.blocks == 0;
                self.attr.opened(ev.tgid, ev.ret as i32, key, created);
                self.see_file(ev, kind);
                self.ensure_mount(ev.file.dev, ev.mnt_ns, ev.tgid);
            }
            EventKind::Close => self.attr.closed(ev.tgid, ev.args[0] as i32),
            // It may hold new tmpfs fds now: look at its fds on the next tick.
            EventKind::RecvFds => self.attr.want_rescan(ev.tgid),
            EventKind::Map => {
                let m = Mapping {
                    start: ev.ret as u64,
                    end: ev.ret as u64 + ev.args[1].div_ceil(PAGE) * PAGE,
                    file_offset: ev.args[5],
                    dev: ev.file.dev,
                    ino: ev.file.ino,
                    name: events::file_name(ev),
                    size: ev.file.size,
                };
                self.ensure_mount(ev.file.dev, ev.mnt_ns, ev.tgid);
                self.maps.add(ev.tgid, m);
                self.see_file(ev, kind);
                // Mapping an fd we never saw opened: it came over a socket,
                // by dup or by fork. Look at its fds on the next tick.
                self.attr.want_rescan(ev.tgid);
            }
            EventKind::Unmap => self.maps.unmap(ev.tgid, ev.args[0], ev.args[1]),
            EventKind::Remap => {
                self.maps
                    .remap(ev.tgid, ev.args[0], ev.args[1], ev.ret as u64, ev.args[2])
            }
            EventKind::SignalDeliver => {
                if let Some(p) = self.procs.get_mut(&ev.tgid) {
                    p.sigbus_handler_ran |= ev.args[2] > 1;
                    p.sigbus_handler = Some(match ev.args[2] {
                        0 => "default".into(),
                        1 => "ignored".into(),
                        h => format!("handler {h:#x}"),
                    });
                }
            }
            EventKind::SignalGenerate => self.on_sigbus(ev),
            EventKind::SyscallFail => self.on_syscall_failure(ev),
            EventKind::OomVictim => self.on_oom(ev),
            EventKind::Truncate => {
                self.sizes.insert((ev.file.dev, ev.file.ino), ev.file.size);
                self.see_file(ev, kind);
            }
        }
    }

    /// A tmpfs file the kernel described in `ev`.
    fn see_file(&mut self, ev: &Event, kind: EventKind) {
        if ev.file.valid == 0 {
            return;
        }
        let name = events::file_name(ev);
        // The last events on each mount: evidence for a failure there.
        let line = format!(
            "+{:.6}s pid {} ({}) {} {} (size {}, {} allocated)",
            ev.ts_ns.saturating_sub(self.start_ns) as f64 / 1e9,
            ev.tgid,
            escape::bytes(&ev.comm),
            events::kind_name(kind),
            name.as_deref().unwrap_or("?"),
            human_bytes(ev.file.size.max(0) as u64),
            human_bytes(ev.file.blocks * 512)
        );
        let q = self.recent.entry(ev.file.dev).or_default();
        if q.len() >= RECENT {
            q.pop_front();
        }
        q.push_back(line);
        self.attr.seen(
            (ev.file.dev, ev.file.ino),
            Seen {
                name: name.as_deref(),
                size: ev.file.size,
                allocated: ev.file.blocks * 512,
                unlinked: ev.file.nlink == 0,
            },
            ev.tgid,
        );
    }

    /// Node-wide: releases anchors of namespaces without live processes for
    /// a grace period (kept that long so late failures there still resolve).
    fn release_idle_namespaces(&mut self, grace: std::time::Duration) {
        let now = std::time::Instant::now();
        let live: std::collections::HashSet<u32> = self
            .procs
            .values()
            .filter(|p| p.alive())
            .map(|p| p.mnt_ns)
            .collect();
        for (ns, _) in self.mounts.anchors.all() {
            if live.contains(&ns) {
                self.ns_last_alive.insert(ns, now);
            } else if now.duration_since(*self.ns_last_alive.entry(ns).or_insert(now)) > grace {
                self.mounts.anchors.release(ns);
                self.ns_last_alive.remove(&ns);
                // Its own tmpfs mounts die with it: stop tracking their files.
                for dev in self.mounts.forget_ns(ns) {
                    self.attr.forget_dev(dev);
                }
            }
        }
    }

    /// The once-a-second refresh: tracked files' allocation, fd rescans,
    /// mount use and peaks, per-process totals and containers.
    pub fn tick(&mut self) {
        if let Some(grace) = self.release_idle_namespaces {
            self.release_idle_namespaces(grace);
        }
        let mounts = &self.mounts;
        self.attr
            .tick(&self.maps, |dev| mounts.by_dev(dev).is_some());
        let mut devs = self.attr.devs();
        devs.extend(self.touched_mounts.keys().copied());
        // Every known namespace's /dev/shm, files or not: its size matters
        // before anything fills it.
        let mut namespaces: Vec<u32> = self
            .mounts
            .anchors
            .all()
            .into_iter()
            .map(|(ns, _)| ns)
            .collect();
        namespaces.push(self.self_ns);
        for ns in namespaces {
            if let Some(m) = self
                .mounts
                .for_path(ns, "/dev/shm")
                .filter(|m| m.is_tmpfs() && m.mountpoint == "/dev/shm")
            {
                devs.insert(m.dev);
            }
        }
        // Mounts of namespaces let go (node-wide) leave the metrics.
        self.mount_stats.retain(|d, _| devs.contains(d));
        for dev in devs {
            let Some(m) = self.mounts.by_dev(dev).cloned() else {
                continue;
            };
            let ns = self.mounts.ns_of_dev(dev).unwrap_or(self.self_ns);
            let anchor = self.mounts.anchors.get(ns).unwrap_or(std::process::id());
            let usage = self.statfs_via(dev, ns, anchor, &m.mountpoint);
            let tracked = self.attr.bytes_on(dev);
            let s = self.mount_stats.entry(dev).or_insert_with(|| MountStat {
                mountpoint: Some(escape::str(&m.mountpoint)),
                dev: kdev_string(dev),
                mount_ns: ns,
                size_bytes: None,
                used_bytes: None,
                free_bytes: None,
                peak_used_bytes: 0,
                tracked_bytes: 0,
                explained_share: None,
            });
            s.tracked_bytes = tracked;
            if let Some(u) = usage {
                s.size_bytes = Some(u.size_bytes);
                s.used_bytes = Some(u.used_bytes);
                s.free_bytes = Some(u.free_bytes());
                s.peak_used_bytes = s.peak_used_bytes.max(u.used_bytes);
                s.explained_share =
                    (u.used_bytes > 0).then(|| (tracked as f64 / u.used_bytes as f64).min(1.0));
            }
        }
        let pids: Vec<u32> = self.procs.keys().copied().collect();
        for pid in pids {
            let b = self.attr.bytes.get(&pid).copied().unwrap_or_default();
            let alive = self.procs.get(&pid).is_some_and(|p| p.alive());
            let cgid = self.procs.get(&pid).map(|p| p.cgroup_id).unwrap_or(0);
            let container = match self.containers.of_id(cgid).cloned() {
                Some(c) => Some(c),
                None if alive => self.containers.of(pid).cloned(),
                None => self.containers.get(pid).cloned(),
            };
            let p = self.procs.get_mut(&pid).expect("listed");
            p.allocated_bytes = b.allocated;
            p.held_bytes = b.held;
            p.peak_allocated_bytes = b.peak_allocated;
            p.peak_held_bytes = b.peak_held;
            if container.is_some() {
                p.container = container;
            }
        }
    }

    /// Keeps what the header says about the process current.
    fn touch(&mut self, ev: &Event) {
        let p = self
            .procs
            .entry(ev.tgid)
            .or_insert_with(|| Proc::new(ev.tgid, ev.ppid, ev.ts_ns));
        p.comm = escape::bytes(&ev.comm);
        if ev.ppid != 0 {
            p.ppid = ev.ppid;
        }
        p.mnt_ns = ev.mnt_ns;
        p.cgroup_id = ev.cgroup_id;
    }

    fn ensure_mount(&mut self, dev: u32, ns: u32, pid: u32) {
        if self.mounts.by_dev(dev).is_some() || self.unmounted.contains(&dev) {
            return;
        }
        let read = self.mounts.refresh(ns, pid);
        if self.mounts.by_dev(dev).is_none() {
            // A device from another namespace: try every anchored one.
            for (ns, anchor) in self.mounts.anchors.all() {
                self.mounts.refresh(ns, anchor);
            }
        }
        if read && self.mounts.by_dev(dev).is_none() {
            // Not even in the namespace of the process using it: kernel-
            // internal shmem (memfd, SysV), mounted nowhere, ever. Remember
            // it, or every event on it would re-read all mount tables.
            self.unmounted.insert(dev);
        }
    }

    fn on_sigbus(&mut self, ev: &Event) {
        let target = ev.args[3] as u32;
        let target_tid = ev.args[4] as u32;
        let code = ev.args[1] as i64 as i32;
        let addr = ev.args[2];
        let other = |reason| OtherSignal {
            ts_ns: ev.ts_ns,
            pid: target,
            tid: target_tid,
            sender_pid: ev.tgid,
            si_code: code,
            si_code_name: signals::sigbus_code_name(code),
            fault_addr: format!("{addr:#x}"),
            reason,
        };
        if code <= 0 {
            // Sent by a process, not by a fault: a handler re-raising it
            // (PyTorch's worker handler does) or kill -BUS.
            if ev.tgid == target {
                if let Some(p) = self.procs.get_mut(&target) {
                    p.sigbus_reraised = true;
                }
                self.other_signals.push(other(
                    "raised by the process itself (a handler re-raising it)",
                ));
            } else {
                self.other_signals.push(other("sent by another process"));
            }
            return;
        }
        // A handler that returns (Rust's runtime installs one) makes the
        // same access fault again: one failure, counted, not collateral.
        if let Some(f) = self.failures.iter_mut().rev().find(|f| {
            f.kind == "sigbus"
                && f.tid == target_tid
                && f.fault_addr.as_deref() == Some(&format!("{addr:#x}"))
        }) {
            f.refaults += 1;
            return;
        }
        let mapping = self.maps.find(target, addr).cloned().or_else(|| {
            // Mapped before we saw it (or the event was lost): ask /proc.
            let mounts = &self.mounts;
            procs::scan_maps(target, |dev| mounts.by_dev(dev).is_some())
                .into_iter()
                .find(|m| m.start <= addr && addr < m.end)
        });
        let Some(m) = mapping else {
            self.other_signals
                .push(other("fault address is not in a tmpfs mapping"));
            return;
        };
        let offset = m.file_offset + (addr - m.start);
        // The file's size now: from the process's map_files link while it
        // lives, else the last ftruncate we saw, else the size when mapped.
        let size = map_file_size(target, &m)
            .or_else(|| self.sizes.get(&(m.dev, m.ino)).copied())
            .unwrap_or(m.size);
        if size >= 0 && offset >= size as u64 {
            self.other_signals.push(other(
                "access beyond the end of a tmpfs file (truncated), not a full tmpfs",
            ));
            return;
        }
        let mount = self.mount_state(m.dev, ev.mnt_ns, target, Some(ev));
        let cause = if code == BUS_ADRERR {
            match mount.as_ref().and_then(|u| Some((u.free_bytes?, u.size_bytes?))) {
                Some((free, size)) if free < PAGE * 64 || free * 100 < size => {
                    "the tmpfs had no free page for this write (full)".to_string()
                }
                Some(_) => "the page could not be allocated on tmpfs (it had room by the time it was measured: another process freed space)".to_string(),
                None => "the page could not be allocated on tmpfs".to_string(),
            }
        } else {
            format!("{} on a tmpfs mapping", signals::sigbus_code_name(code))
        };
        let path = self.path_of(m.dev, m.name.as_deref(), ev.mnt_ns);
        let f = Failure {
            kind: "sigbus",
            syscall: None,
            errno: None,
            errno_name: None,
            signal: Some(ev.args[0] as i32),
            si_code: Some(code),
            si_code_name: Some(signals::sigbus_code_name(code)),
            fault_addr: Some(format!("{addr:#x}")),
            path,
            dev: Some(kdev_string(m.dev)),
            ino: Some(m.ino),
            offset: Some(offset),
            bytes: Some(PAGE),
            file_size: (size >= 0).then_some(size),
            unlinked: None,
            cause,
            mount,
            ..self.base_failure(ev, target, target_tid)
        };
        self.record(f);
    }

    fn on_syscall_failure(&mut self, ev: &Event) {
        let errno = (-ev.ret) as i32;
        let sc = syscall_name(ev.syscall);
        let a = ev.args;
        let errno_kind = match -ev.ret {
            ENOSPC => "enospc",
            EDQUOT => "edquot",
            EFBIG => "efbig",
            ENOMEM => "enomem",
            _ => "error",
        };
        let mut f = Failure {
            kind: errno_kind,
            syscall: Some(sc),
            errno: Some(errno),
            errno_name: Some(signals::errno_name(errno)),
            ..self.base_failure(ev, ev.tgid, ev.tid)
        };
        match sc {
            "open" | "openat" | "openat2" | "creat" => {
                let Some((path, mount)) = self.resolve_open_path(ev) else {
                    return; // not under a tmpfs mount: not a shm failure
                };
                f.path = Some(path);
                f.dev = Some(kdev_string(mount));
                f.mount = self.mount_state(mount, ev.mnt_ns, ev.tgid, None);
                f.cause = match f
                    .mount
                    .as_ref()
                    .and_then(|m| Some((m.inodes?, m.inodes_used?)))
                {
                    Some((total, used)) if total > 0 && used + 1 >= total => {
                        format!(
                            "creating a file failed: the tmpfs inode limit ({total}) is reached"
                        )
                    }
                    _ => format!(
                        "creating a file on tmpfs failed: {}",
                        signals::errno_text(errno)
                    ),
                };
            }
            "mremap" => {
                let Some(m) = self.maps.find(ev.tgid, a[0]).cloned() else {
                    return;
                };
                f.kind = "mremap_error";
                f.path = self.path_of(m.dev, m.name.as_deref(), ev.mnt_ns);
                f.dev = Some(kdev_string(m.dev));
                f.ino = Some(m.ino);
                f.offset = Some(m.file_offset + (a[0] - m.start));
                f.bytes = Some(a[2]);
                f.mount = self.mount_state(m.dev, ev.mnt_ns, ev.tgid, None);
                f.cause = format!(
                    "mremap of a tmpfs mapping failed: {}",
                    signals::errno_text(errno)
                );
            }
            _ => {
                if ev.file.valid == 0 {
                    return;
                }
                let (offset, bytes) = match sc {
                    "fallocate" => (Some(a[2]), Some(a[3])),
                    "write" | "pwrite64" => (Some(a[3]), Some(a[2])),
                    "writev" | "pwritev" | "pwritev2" => (Some(a[3]), None),
                    "ftruncate" => (None, Some(a[1])),
                    "mmap" => (Some(a[5]), Some(a[1])),
                    _ => (None, None),
                };
                if sc == "mmap" {
                    f.kind = "mmap_error";
                }
                self.ensure_mount(ev.file.dev, ev.mnt_ns, ev.tgid);
                f.path = self.path_of(ev.file.dev, events::file_name(ev).as_deref(), ev.mnt_ns);
                f.dev = Some(kdev_string(ev.file.dev));
                f.ino = Some(ev.file.ino);
                f.offset = offset;
                f.bytes = bytes;
                f.file_size = Some(ev.file.size);
                f.unlinked = Some(ev.file.nlink == 0);
                f.mount = self.mount_state(ev.file.dev, ev.mnt_ns, ev.tgid, Some(ev));
                f.cause = match (sc, errno_kind) {
                    ("mmap", _) => format!(
                        "mmap of a tmpfs file failed: {}",
                        signals::errno_text(errno)
                    ),
                    (_, "enospc") => match (bytes, f.mount.as_ref().and_then(|m| m.free_bytes)) {
                        (Some(b), Some(free)) if human_bytes(b) == human_bytes(free) => format!(
                            "{sc} asked for {b} bytes but the tmpfs had {free} bytes free (No space left on device)"
                        ),
                        (Some(b), Some(free)) => format!(
                            "{sc} asked for {} but the tmpfs had {} free (No space left on device)",
                            human_bytes(b),
                            human_bytes(free)
                        ),
                        _ => format!("{sc} found the tmpfs full (No space left on device)"),
                    },
                    _ => format!("{sc} on tmpfs failed: {}", signals::errno_text(errno)),
                };
            }
        }
        self.record(f);
    }

    fn on_oom(&mut self, ev: &Event) {
        let victim = ev.args[0] as u32;
        let shmem = ev.args[1] * 1024;
        let held = if shmem > 0 {
            format!(" holding {} of shared memory", human_bytes(shmem))
        } else {
            String::new()
        };
        let f = Failure {
            kind: "oom_kill",
            bytes: (shmem > 0).then_some(shmem),
            cause: format!(
                "the OOM killer chose this process{held} (shared memory pages count against its memory cgroup)"
            ),
            ..self.base_failure(ev, victim, victim)
        };
        self.record(f);
    }

    fn base_failure(&self, ev: &Event, pid: u32, tid: u32) -> Failure {
        let p = self.procs.get(&pid);
        Failure {
            ts_ns: ev.ts_ns,
            time_s: ev.ts_ns.saturating_sub(self.start_ns) as f64 / 1e9,
            delay_ns: 0,
            pid,
            tid,
            ppid: p
                .map(|p| p.ppid)
                .unwrap_or(if pid == ev.tgid { ev.ppid } else { 0 }),
            comm: p
                .map(|p| p.comm.clone())
                .unwrap_or_else(|| escape::bytes(&ev.comm)),
            kind: "",
            syscall: None,
            errno: None,
            errno_name: None,
            signal: None,
            si_code: None,
            si_code_name: None,
            fault_addr: None,
            path: None,
            dev: None,
            ino: None,
            offset: None,
            bytes: None,
            file_size: None,
            unlinked: None,
            cause: String::new(),
            mount: None,
            ancestry: self.ancestry(pid),
            mnt_ns: p.map(|p| p.mnt_ns).unwrap_or(ev.mnt_ns),
            refaults: 0,
            container: None,
            holders: Vec::new(),
            events_before: Vec::new(),
        }
    }

    fn record(&mut self, mut f: Failure) {
        let kdev = f.dev.as_deref().and_then(parse_kdev);
        if let Some(dev) = kdev
            && !self.touched_mounts.contains_key(&dev)
        {
            // The first failure on this mount: refresh who holds what now,
            // while the processes involved are most likely still there.
            let mounts = &self.mounts;
            self.attr.tick(&self.maps, |d| mounts.by_dev(d).is_some());
            f.holders = self
                .attr
                .holders_on(dev)
                .into_iter()
                .filter(|&(_, b)| b > 0)
                .take(5)
                .map(|(pid, held_bytes)| Holder {
                    pid,
                    comm: self
                        .procs
                        .get(&pid)
                        .map(|p| p.comm.clone())
                        .unwrap_or_default(),
                    held_bytes,
                })
                .collect();
            f.events_before = self
                .recent
                .get(&dev)
                .map(|q| q.iter().cloned().collect())
                .unwrap_or_default();
        }
        let cgid = self.procs.get(&f.pid).map(|p| p.cgroup_id).unwrap_or(0);
        f.container = match self.containers.of_id(cgid).cloned() {
            Some(c) => Some(c),
            None => self.containers.of(f.pid).cloned(),
        };
        if let Some(m) = &f.mount
            && let Some(dev) = &f.dev
            && let Some(kdev) = parse_kdev(dev)
        {
            self.touched_mounts.entry(kdev).or_insert_with(|| m.clone());
        }
        self.failures.push(f);
    }

    /// Parents from `pid` up to the first process we do not trace.
    pub fn ancestry(&self, pid: u32) -> Vec<Ancestor> {
        let mut out = Vec::new();
        let mut cur = self.procs.get(&pid).map(|p| p.ppid);
        while let Some(pp) = cur {
            if pp == 0 || out.len() > 64 {
                break;
            }
            match self.procs.get(&pp) {
                Some(p) => {
                    out.push(Ancestor {
                        pid: pp,
                        comm: p.comm.clone(),
                    });
                    if p.root {
                        break;
                    }
                    cur = Some(p.ppid);
                }
                None => break,
            }
        }
        out
    }

    /// "/dev/shm/name" from a device and the kernel's name for the file.
    fn path_of(&mut self, dev: u32, name: Option<&str>, ns: u32) -> Option<String> {
        let name = name?;
        self.ensure_mount(dev, ns, std::process::id());
        Some(match self.mounts.by_dev(dev) {
            Some(m) if m.mountpoint == "/" => format!("/{name}"),
            Some(m) => format!("{}/{name}", escape::str(&m.mountpoint)),
            None => format!("shmem:{name}"),
        })
    }

    /// Resolves an open*() path to an absolute path on a tmpfs mount.
    fn resolve_open_path(&mut self, ev: &Event) -> Option<(String, u32)> {
        let raw = &ev.path;
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        let path = String::from_utf8_lossy(&raw[..end]).into_owned();
        let abs = if path.starts_with('/') {
            path.clone()
        } else {
            let dirfd = ev.args[0] as i32;
            let base = if syscall_name(ev.syscall).starts_with("openat") && dirfd != libc::AT_FDCWD
            {
                std::fs::read_link(format!("/proc/{}/fd/{dirfd}", ev.tgid)).ok()?
            } else {
                std::fs::read_link(format!("/proc/{}/cwd", ev.tgid)).ok()?
            };
            format!("{}/{path}", base.display())
        };
        // Mounts change (unshare + mount): read them fresh for a failure.
        self.mounts.refresh(ev.mnt_ns, ev.tgid);
        let m = self.mounts.for_path(ev.mnt_ns, &abs)?;
        m.is_tmpfs().then(|| (escape::str(&abs), m.dev))
    }

    /// Size and use of mount `dev` at the event: the kernel's superblock
    /// counters read by the eBPF program at that instant when the event
    /// carries them, else statfs right now (exact, but later: a process that
    /// died since may have freed its pages). Inode counts come from statfs.
    fn mount_state(
        &mut self,
        dev: u32,
        ns: u32,
        pid: u32,
        ev: Option<&Event>,
    ) -> Option<MountAtFailure> {
        self.ensure_mount(dev, ns, pid);
        let mountpoint = self.mounts.by_dev(dev).map(|m| m.mountpoint.clone());
        let ns = self.mounts.ns_of_dev(dev).unwrap_or(ns);
        let mut out = MountAtFailure {
            mountpoint: mountpoint.as_deref().map(escape::str),
            dev: kdev_string(dev),
            mount_ns: ns,
            size_bytes: None,
            used_bytes: None,
            free_bytes: None,
            inodes: None,
            inodes_used: None,
            source: "none",
        };
        if let Some(mp) = &mountpoint
            && let Some(u) = self.statfs_via(dev, ns, pid, mp)
        {
            out.size_bytes = Some(u.size_bytes);
            out.used_bytes = Some(u.used_bytes);
            out.free_bytes = Some(u.free_bytes());
            out.inodes = Some(u.inodes);
            out.inodes_used = Some(u.inodes_used);
            out.source = "statfs";
        }
        if let Some(ev) = ev
            && ev.file.dev == dev
            && ev.file.fs_max_pages > 0
        {
            let size = ev.file.fs_max_pages * PAGE;
            let used = (ev.file.fs_used_pages.max(0) as u64 * PAGE).min(size);
            out.size_bytes = Some(size);
            out.used_bytes = Some(used);
            out.free_bytes = Some(size - used);
            out.source = "kernel";
        }
        Some(out)
    }

    /// statfs through some live process of namespace `ns`, checking that the
    /// path really is device `dev` there.
    fn statfs_via(&self, dev: u32, ns: u32, pid: u32, mountpoint: &str) -> Option<Usage> {
        // The anchor (shmtrace itself for its own namespace) nearly always
        // answers; live processes of the namespace are the fallback.
        let candidates = self
            .mounts
            .anchors
            .get(ns)
            .into_iter()
            .chain(std::iter::once(pid))
            .chain(
                self.procs
                    .values()
                    .filter(|p| p.mnt_ns == ns && p.alive())
                    .map(|p| p.pid),
            );
        for c in candidates {
            let path = format!("/proc/{c}/root{mountpoint}");
            let Ok(st) = nix::sys::stat::stat(path.as_str()) else {
                continue;
            };
            let (maj, min) = (libc::major(st.st_dev) as u32, libc::minor(st.st_dev) as u32);
            if mounts::kdev(maj, min) != dev {
                continue;
            }
            if let Some(u) = mounts::statfs(Some(c), mountpoint) {
                return Some(u);
            }
        }
        None
    }

    /// Finalizes failure order: kernel time, then delay after the first.
    pub fn ordered_failures(&self) -> Vec<Failure> {
        let mut v = self.failures.clone();
        v.sort_by_key(|f| f.ts_ns);
        if let Some(first) = v.first().map(|f| f.ts_ns) {
            for f in &mut v {
                f.delay_ns = f.ts_ns - first;
            }
        }
        v
    }
}

/// Current size of the file behind mapping `m`, through /proc/PID/map_files.
fn map_file_size(pid: u32, m: &Mapping) -> Option<i64> {
    let st =
        nix::sys::stat::stat(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end).as_str())
            .ok()?;
    (st.st_ino == m.ino).then_some(st.st_size)
}

fn parse_kdev(s: &str) -> Option<u32> {
    let (a, b) = s.split_once(':')?;
    Some(mounts::kdev(a.parse().ok()?, b.parse().ok()?))
}

/// Inode number of /proc/<who>/ns/mnt.
pub fn mnt_ns_of(who: &str) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{who}/ns/mnt"))
        .ok()
        .map(|m| m.ino() as u32)
}

pub fn human_bytes(b: u64) -> String {
    const K: f64 = 1024.0;
    let f = b as f64;
    if f >= K * K * K {
        format!("{:.1} GiB", f / (K * K * K))
    } else if f >= K * K {
        format!("{:.1} MiB", f / (K * K))
    } else if f >= K {
        format!("{:.1} KiB", f / K)
    } else {
        format!("{b} B")
    }
}
