//! State: what the events say, kept in small components, each owning one
//! kind of fact. [`State::apply`] routes each typed event to them; every
//! read of the machine goes through the [`Host`] it is given, so a unit
//! test drives it with a fixture host and a synthetic event stream.
//! `apply` and `tick` are the two routes through every component and read
//! best side by side; what each event does beyond routing lives in the
//! component files.

pub mod causes;
pub mod classify;
pub mod containers;
pub mod evidence;
pub mod failures;
pub mod files;
pub mod headroom;
mod identity;
pub mod incidents;
pub mod locate;
pub mod mappings;
pub(crate) mod missing;
pub mod mount_stats;
pub mod mounts;
pub mod procs;
mod record;
pub mod removals;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    time::{Duration, Instant},
};

use crate::{
    event::{Addr, Dev, Event, FileKey, FileRef, Header, Kind},
    host::{Host, memcg::Memcg},
    units::page_size,
};

use self::{
    containers::Containers,
    evidence::{Evidence, Noted},
    failures::Failures,
    files::{Files, Seen},
    mappings::{Mapping, MappingTable},
    mount_stats::MountStats,
    mounts::MountTables,
    procs::{Proc, ProcessTree},
};

/// Namespaces remembered as seen (then forgotten at once: a reread more).
const MAX_NS_EXECS: usize = 4096;

pub struct State {
    /// CLOCK_MONOTONIC when shmtrace started (times are shown after it).
    start_ns: u64,
    /// shmtrace's own mount namespace: the host's view.
    self_ns: u32,
    /// The host's mount namespace: init's (pid 1, with hostPID the node's),
    /// else shmtrace's own. No container owns it, whatever ran in it.
    host_ns: u32,
    /// Node-wide: an exec reads nothing (every process start on the node
    /// comes here). Tracing a job: its few execs read what they used to
    /// (command line, mounts, container) while the process surely lives.
    lazy_exec: bool,
    /// (namespace, device) whose mount table was reread because the device
    /// was missing from it (see `ensure_mount`).
    ns_dev_reread: std::collections::HashSet<(u32, Dev)>,
    /// Namespaces whose first exec was seen (node-wide).
    ns_first_exec: std::collections::HashSet<u32>,
    procs: ProcessTree,
    maps: MappingTable,
    mounts: MountTables,
    mount_stats: MountStats,
    /// Who holds the bytes.
    files: Files,
    containers: Containers,
    failures: Failures,
    /// Node-wide, one story per failing mount.
    incidents: incidents::Incidents,
    evidence: Evidence,
    /// Latest known i_size of tmpfs files, from ftruncate.
    sizes: HashMap<(Dev, u64), i64>,
    /// Node-wide: let go of mount namespaces whose processes have all been
    /// gone this long (a long-running tracer must not keep dead containers'
    /// /dev/shm alive). None: keep them until shmtrace exits.
    release_idle_namespaces: Option<Duration>,
    /// When each anchored namespace was last seen with a live process.
    ns_last_alive: HashMap<u32, Instant>,
    /// Who removed which /dev/shm file.
    removals: removals::Removals,
    /// Opens that found a /dev/shm name gone, held back a moment: a process
    /// that goes on to create the name was only looking (attach or create).
    missing: Vec<(failures::Failure, removals::Where)>,
}

impl State {
    pub fn new(start_ns: u64, host: &mut dyn Host) -> Self {
        let mut s = Self {
            start_ns,
            self_ns: host.self_ns(),
            host_ns: host.mnt_ns(1).unwrap_or_else(|| host.self_ns()),
            lazy_exec: false,
            ns_dev_reread: Default::default(),
            ns_first_exec: Default::default(),
            procs: ProcessTree::default(),
            maps: MappingTable::default(),
            mounts: MountTables::default(),
            mount_stats: MountStats::default(),
            files: Files::default(),
            containers: Containers::default(),
            failures: Failures::default(),
            incidents: incidents::Incidents::default(),
            evidence: Evidence::default(),
            sizes: HashMap::new(),
            release_idle_namespaces: None,
            ns_last_alive: HashMap::new(),
            removals: removals::Removals::default(),
            missing: Vec::new(),
        };
        let (ns, me) = (host.self_ns(), host.self_pid());
        s.refresh_mounts(host, ns, me);
        s
    }

    /// Node-wide: namespaces whose processes have all been gone for
    /// `grace` are let go (their /dev/shm leaves the books).
    pub fn release_idle_namespaces_after(&mut self, grace: Duration) {
        self.release_idle_namespaces = Some(grace);
    }

    /// Closes every open incident (shmtrace is stopping).
    pub fn close_incidents(&mut self, now_ns: u64) {
        self.incidents.close_all(now_ns);
    }

    /// Closes incidents without a failure for `quiet_ns`.
    pub fn close_quiet_incidents(&mut self, now_ns: u64, quiet_ns: u64) {
        self.incidents.close_quiet(now_ns, quiet_ns);
    }

    /// CLOCK_MONOTONIC when shmtrace started.
    pub fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// shmtrace's own mount namespace: what the host sees.
    pub fn self_ns(&self) -> u32 {
        self.self_ns
    }

    /// The host's mount namespace (init's, else shmtrace's own).
    pub fn host_ns(&self) -> u32 {
        self.host_ns
    }

    /// The container that owns mount namespace `ns`: that of a process
    /// living (else once living) in it, named as known now. None for the
    /// host's namespace: a runtime's setup process (`runc init`) is in a
    /// container's cgroup before it leaves the host's namespace, and that
    /// does not make the host's mounts the container's.
    pub fn mount_container(&self, ns: u32) -> Option<&containers::Container> {
        if ns == self.host_ns {
            return None;
        }
        // The living first: a name known now.
        self.procs
            .alive()
            .chain(self.procs.all().filter(|p| !p.alive()))
            .filter(|p| p.mnt_ns == ns)
            .find_map(|p| {
                self.named(p.container.as_ref())
                    .filter(|c| c.is_container())
            })
    }

    /// A process's or failure's container as known now: its names may
    /// have been found after it was recorded.
    pub fn named<'a>(
        &'a self,
        c: Option<&'a containers::Container>,
    ) -> Option<&'a containers::Container> {
        c.map(|c| self.containers.by_cgroup(&c.cgroup).unwrap_or(c))
    }

    /// Node-wide: execs read nothing from /proc (see [`State::apply`]).
    pub fn read_lazily_at_exec(&mut self) {
        self.lazy_exec = true;
    }

    /// The processes seen, live and recently exited.
    pub fn procs(&self) -> &ProcessTree {
        &self.procs
    }

    /// tmpfs files, who holds and who allocated them.
    pub fn files(&self) -> &Files {
        &self.files
    }

    /// Each tmpfs mount's size and use over time.
    pub fn mount_stats(&self) -> &MountStats {
        &self.mount_stats
    }

    /// Containers by cgroup, with their names.
    pub fn containers(&self) -> &Containers {
        &self.containers
    }

    /// The failures, in kernel order, and SIGBUS that were none.
    pub fn failures(&self) -> &Failures {
        &self.failures
    }

    /// Node-wide: one per failing mount.
    pub fn incidents(&self) -> &incidents::Incidents {
        &self.incidents
    }

    /// Counts of events, and the last events on each mount.
    pub fn evidence(&self) -> &Evidence {
        &self.evidence
    }

    /// For tests of what output renders from odd mount values.
    #[cfg(test)]
    pub(crate) fn mount_stats_mut(&mut self) -> &mut MountStats {
        &mut self.mount_stats
    }

    /// Seconds since shmtrace started, for humans.
    pub fn since_start(&self, ts_ns: u64) -> f64 {
        ts_ns.saturating_sub(self.start_ns) as f64 / 1e9
    }

    /// Registers a process found in /proc: the `run` command or `--pid`
    /// target (`root`), or one seeded node-wide, with what it already maps.
    /// Returns whether it already has tmpfs mappings.
    pub fn add_existing(&mut self, host: &mut dyn Host, pid: u32, ts: u64, root: bool) -> bool {
        let (ppid, comm) = host.proc_stat(pid).unwrap_or((0, String::new()));
        let ns = host.mnt_ns(pid).unwrap_or(0);
        let mut p = Proc::new(pid, ppid, ts);
        p.comm = comm;
        p.cmdline = host.cmdline(pid);
        p.root = root;
        p.mnt_ns = ns;
        self.procs.adopted(p);
        self.refresh_mounts(host, ns, pid);
        let mut any = false;
        for m in host.maps(pid) {
            if self.mounts.by_dev(m.dev).is_some_and(|t| t.is_tmpfs()) {
                self.maps.mapped(pid, Mapping::from(m));
                any = true;
            }
        }
        // What it holds already counts from the first screen.
        self.files.want_rescan(pid);
        any
    }

    /// Registers the command `run` just started: nothing to read (it maps
    /// nothing yet; its exec event brings the rest), so nothing delays the
    /// first look at its events (a job may be done in milliseconds).
    pub fn add_started(&mut self, pid: u32, ts: u64, comm: &str, cmdline: String, mnt_ns: u32) {
        let mut p = Proc::new(pid, std::process::id(), ts);
        p.comm = comm.to_string();
        p.cmdline = Some(cmdline);
        p.root = true;
        p.mnt_ns = mnt_ns;
        self.procs.adopted(p);
    }

    /// `pid`'s command line from /proc, once per program it runs, for a
    /// process worth it (it touched a tmpfs, failed, or holds bytes).
    pub(super) fn read_cmdline(&mut self, host: &mut dyn Host, pid: u32) {
        if self.procs.get(pid).is_some_and(|p| !p.cmdline_read) {
            self.procs.cmdline_read(pid, host.cmdline(pid));
        }
    }

    /// Live processes that hold or map a tmpfs file now.
    pub fn shm_users(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .files
            .all()
            .into_iter()
            .flat_map(|f| f.fd_holders.iter().chain(&f.map_holders).copied())
            .filter(|&p| self.procs.get(p).is_some_and(|p| p.alive()))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    pub fn live_pids(&self) -> Vec<u32> {
        self.procs.alive().map(|p| p.pid).collect()
    }

    /// Before a batch is applied: anchors every mount namespace it shows
    /// for the first time, through the process the event came from, while
    /// that process most likely still lives (a job in a private namespace
    /// may be gone before its turn in the batch comes).
    pub fn prepare(&mut self, evs: &[Event], host: &mut dyn Host) {
        for ev in evs {
            if matches!(ev, Event::Sigbus { .. } | Event::OomVictim { .. }) {
                continue;
            }
            let h = ev.header();
            if h.mnt_ns != 0 && host.anchor_of(h.mnt_ns).is_none() {
                self.refresh_mounts(host, h.mnt_ns, h.pid);
            }
        }
    }

    /// One event, in kernel-time order.
    pub fn apply(&mut self, ev: &Event, host: &mut dyn Host) {
        self.evidence.counted(ev.kind());
        let h = ev.header();
        // A SIGBUS header is its sender and an OOM kill's is whoever ran
        // out: neither says anything about the process it is about.
        if !matches!(ev, Event::Sigbus { .. } | Event::OomVictim { .. }) {
            self.procs.seen(h);
            // Its memory cgroup as the kernel named it: resolved now, when
            // the id is known, and at each tick otherwise.
            if h.memcg_id != 0 && !self.procs.has_memcg(h.pid) {
                self.procs.set_memcg(h.pid, host.memcg_path(h.memcg_id));
            }
            // First sight of a mount namespace: anchor it while a process
            // of it is surely alive (this one, at this event).
            if host.anchor_of(h.mnt_ns).is_none() {
                self.refresh_mounts(host, h.mnt_ns, h.pid);
            }
        }
        match ev {
            Event::Fork { h, child } => {
                // A reused pid: the old process's totals must not become
                // the new one's.
                if self.procs.forked(h, *child) {
                    self.files.forget_pid(*child);
                    self.containers.forget(*child);
                }
                self.maps.forked(h.pid, *child);
                self.files.forked(h.pid, *child);
                self.containers.inherit(h.pid, *child);
            }
            Event::Exec { h, filename, .. } => {
                self.maps.cleared(h.pid);
                self.procs.execed(h.pid, filename.clone());
                self.containers.forget(h.pid);
                if self.lazy_exec {
                    // Node-wide, every process start comes here: nothing is
                    // read from /proc. The event has the program, pids,
                    // cgroup and namespace; the command line, mounts and
                    // container are read when the process touches a tmpfs,
                    // fails or holds bytes (a tmpfs event on a device not
                    // yet known rereads its namespace's mounts).
                    // Inherited tmpfs fds that were close-on-exec are gone.
                    if self.files.holds_fds(h.pid) {
                        self.files.want_rescan(h.pid);
                    }
                    // A container's first program runs after its runtime
                    // mounted its /dev/shm and pivoted: its namespace's
                    // table is read again then, once.
                    if h.mnt_ns != self.self_ns && self.ns_first_exec.insert(h.mnt_ns) {
                        if self.ns_first_exec.len() > MAX_NS_EXECS {
                            self.ns_first_exec.clear();
                        }
                        self.refresh_mounts(host, h.mnt_ns, h.pid);
                    }
                } else {
                    // A traced job's exec: read now, while it surely lives
                    // (a job may be done in milliseconds).
                    self.read_cmdline(host, h.pid);
                    // A new program may have changed its mounts.
                    self.refresh_mounts(host, h.mnt_ns, h.pid);
                    self.files.want_rescan(h.pid);
                    self.container_of_pid(host, h.pid);
                }
            }
            Event::Exit { h, status } => {
                self.procs.exited(h.pid, h.ts_ns, *status);
                self.maps.cleared(h.pid);
                self.files.gone(h.pid);
            }
            Event::Opened {
                h, fd, flags, file, ..
            } => {
                let creat = flags & libc::O_CREAT as u64 != 0;
                let created = creat && file.size == 0 && file.allocated == 0;
                // A writer of tmpfs: where its pages will be charged (from
                // /proc when the kernel gave no id), and what it runs.
                if self.procs.get(h.pid).is_some()
                    && !self.procs.has_memcg(h.pid)
                    && h.memcg_id == 0
                {
                    self.procs.set_memcg(h.pid, host.memcg_of(h.pid));
                }
                self.read_cmdline(host, h.pid);
                match fd {
                    Some(fd) => self.files.opened(h.pid, *fd, file.key(), created),
                    // Created before its open had an fd: the fd comes
                    // from the next listing of the creator's fds.
                    None => {
                        self.files.created(h.pid, file.key());
                        self.files.want_rescan(h.pid);
                    }
                }
                if created && let Some(name) = &file.name {
                    self.created_after_missing(h.pid, file.dev, name);
                }
                self.saw_file(h, ev.kind(), file);
                self.ensure_mount(host, file.dev, h.mnt_ns, h.pid);
            }
            Event::Unlinked {
                h, path, dir_dev, ..
            } => self.on_unlink(host, h, path, *dir_dev),
            // It may hold new tmpfs fds now: look at its fds on the next tick.
            Event::FdsReceived { h, .. } => self.files.want_rescan(h.pid),
            Event::Mapped {
                h,
                addr,
                len,
                offset,
                file,
                mountpoint,
                ..
            } => {
                if let Some(mp) = mountpoint {
                    self.mounts.learn_from_kernel(file.dev, mp);
                }
                self.ensure_mount(host, file.dev, h.mnt_ns, h.pid);
                self.maps.mapped(
                    h.pid,
                    Mapping {
                        start: *addr,
                        end: Addr(addr.0 + len.div_ceil(page_size()) * page_size()),
                        file_offset: *offset,
                        dev: file.dev,
                        ino: file.ino,
                        name: file.name.clone(),
                        size: file.size,
                    },
                );
                self.saw_file(h, ev.kind(), file);
                // Mapping an fd we never saw opened: it came over a socket,
                // by dup or by fork. Look at its fds on the next tick.
                self.files.want_rescan(h.pid);
            }
            Event::Remapped {
                h,
                old_addr,
                old_len,
                new_addr,
                new_len,
            } => self
                .maps
                .remapped(h.pid, *old_addr, *old_len, *new_addr, *new_len),
            Event::SigbusDelivered { h, handler, .. } => {
                self.procs.sigbus_delivered(h.pid, *handler)
            }
            Event::Truncated { h, file, .. } => {
                self.sizes.insert(file.key(), file.size);
                self.saw_file(h, ev.kind(), file);
            }
            Event::Sigbus { .. } => self.on_sigbus(ev, host),
            Event::SyscallFailed { .. } => self.on_syscall_failure(ev, host),
            Event::OomVictim { .. } => self.on_oom(ev, host),
            Event::CudaIpcFailed { .. } => self.on_cuda_ipc(ev, host),
        }
    }

    /// A tmpfs file the kernel described in an event of `h`'s process.
    fn saw_file(&mut self, h: &Header, kind: Kind, file: &FileRef) {
        // The last events on each mount: evidence for a failure there.
        self.evidence.noted(
            file.dev,
            Noted {
                ts_ns: h.ts_ns,
                pid: h.pid,
                comm: h.comm.clone(),
                kind,
                name: file.name.clone(),
                sizes: Some((file.size.max(0) as u64, file.allocated)),
            },
        );
        // The mount's use as the kernel read it at this event: it may fill
        // and empty again before the next sample.
        let m = file.mount;
        if m.used_pages > 0 {
            let used = m.used_pages * page_size();
            let used = match m.max_pages {
                0 => used,
                max => used.min(max * page_size()),
            };
            self.mount_stats.saw_use(file.dev, used);
        }
        self.files.seen(
            file.key(),
            Seen {
                name: file.name.as_deref(),
                size: file.size,
                allocated: file.allocated,
                unlinked: file.unlinked,
            },
            h.pid,
        );
    }

    /// Reads namespace `ns`'s mount table (through `pid`, a process in it).
    fn refresh_mounts(&mut self, host: &mut dyn Host, ns: u32, pid: u32) -> bool {
        if ns == 0 {
            return false;
        }
        match host.mountinfo(ns, pid) {
            Some(ms) => {
                self.mounts.learn(ns, ms);
                true
            }
            None => false,
        }
    }

    /// Live processes of namespace `ns`: who can show its mounts.
    fn members_of(&self, ns: u32) -> Vec<u32> {
        self.procs
            .alive()
            .filter(|p| p.mnt_ns == ns)
            .map(|p| p.pid)
            .take(4)
            .collect()
    }

    /// Node-wide: releases anchors of namespaces without live processes for
    /// a grace period (kept that long so late failures there still resolve).
    fn release_idle_namespaces(&mut self, host: &mut dyn Host, grace: Duration) {
        let now = host.now();
        let live: BTreeSet<u32> = self.procs.alive().map(|p| p.mnt_ns).collect();
        for ns in host.anchored() {
            if live.contains(&ns) {
                self.ns_last_alive.insert(ns, now);
            } else if now.duration_since(*self.ns_last_alive.entry(ns).or_insert(now)) > grace {
                host.release(ns);
                self.ns_last_alive.remove(&ns);
                // Its own tmpfs mounts die with it: stop tracking their files.
                for dev in self.mounts.forget_ns(ns) {
                    self.files.forget_dev(dev);
                    self.evidence.forget_dev(dev);
                }
            }
        }
    }

    /// Attribution's refresh: whether each tracked fd is still its file,
    /// fds of flagged processes, then each tracked file's allocation
    /// through a holder.
    fn refresh_files(&mut self, host: &mut dyn Host) {
        // Closes are not hooked (every close on the node would pay for
        // it): a tracked fd that no longer is its file was closed or
        // reused since, or its process is gone. Its process's fds are
        // listed then: that drops the fd if the process lives (finding
        // any copy it made unseen first, dup or fcntl F_DUPFD then close,
        // as shells move redirections), and keeps the books of one that
        // is gone until its exit is applied (an OOM victim is gone by the
        // time its kill is, and its files are the evidence). The first
        // stat that finds a file is its measurement.
        let mut measured: HashSet<FileKey> = HashSet::new();
        for (pid, fd, key) in self.files.fd_checks() {
            if Files::is_placeholder(fd) {
                self.files.want_rescan(pid);
                continue;
            }
            match host.stat_fd(pid, fd).filter(|st| (st.dev, st.ino) == key) {
                Some(st) => {
                    if measured.insert(key) {
                        self.files.measured(key, Some(st));
                    }
                }
                None => self.files.want_rescan(pid),
            }
        }
        for pid in self.files.take_rescans() {
            if let Some(found) = host.fds(pid) {
                let mounts = &self.mounts;
                let keys = self.files.rescanned(pid, found, |d| {
                    mounts.by_dev(d).is_some_and(|m| m.is_tmpfs())
                });
                measured.extend(keys);
            }
        }
        self.refresh_mappings(host);
        self.files.set_map_holders(&self.maps.holders());
        for (key, mappers) in self.files.stat_plan() {
            if measured.contains(&key) {
                continue;
            }
            let st = mappers
                .iter()
                .find_map(|&pid| host.stat_mapped(pid, key.0, key.1));
            if st.is_some() {
                measured.insert(key);
            }
            self.files.measured(key, st);
        }
        // Nobody holds them, or no holder answered (gone before its exit
        // was applied): the name tells whether they are still there, and
        // their size (else they were unlinked).
        for (key, rel) in self.files.unmeasured_named(&measured) {
            let Some((ns, m)) = self.mounts.measure_at(key.0) else {
                continue;
            };
            let found = host.lookup(key.0, ns, &m.mountpoint, &rel);
            self.files.looked_up(key, found);
        }
        self.files.trim();
        let files = &self.files;
        self.sizes.retain(|k, _| files.contains(*k));
        self.files.update_bytes();
    }

    /// munmap is not hooked either (every process on the node would pay
    /// for it): a tracked mapping whose range no longer maps its file was
    /// unmapped, or merged or split, since. That process's tmpfs mappings
    /// are read again from /proc; one that has exited (a zombie's maps
    /// list empty) keeps its own until its exit is applied, as with fds.
    fn refresh_mappings(&mut self, host: &mut dyn Host) {
        let checks = self.maps.checks();
        self.check_mappings(host, checks);
    }

    fn check_mappings(&mut self, host: &mut dyn Host, checks: Vec<(u32, Addr, Addr, FileKey)>) {
        let mut stale = BTreeSet::new();
        for (pid, start, end, key) in checks {
            if !stale.contains(&pid)
                && host
                    .stat_map_range(pid, start, end)
                    .filter(|st| (st.dev, st.ino) == key)
                    .is_none()
            {
                stale.insert(pid);
            }
        }
        for pid in stale {
            if host.has_exited(pid) {
                continue;
            }
            let maps = host.maps(pid);
            // A live process maps at least its executable: no file mapping
            // at all is an address space already torn down (exiting, not a
            // zombie yet), whose books stay until its exit event.
            if maps.is_empty() {
                continue;
            }
            let mounts = &self.mounts;
            let found = maps
                .into_iter()
                .filter(|m| mounts.by_dev(m.dev).is_some_and(|t| t.is_tmpfs()))
                .map(Mapping::from)
                .collect();
            self.maps.reread(pid, found);
        }
    }

    /// Before a fault address is read against `pid`'s tracked mappings:
    /// a range unmapped and mapped again since the last tick is read anew.
    pub(super) fn check_mappings_of(&mut self, host: &mut dyn Host, pid: u32) {
        let checks = self.maps.checks_of(pid);
        self.check_mappings(host, checks);
    }

    /// The once-a-second refresh: tracked files' allocation, fd rescans,
    /// mount use and peaks, per-process totals and containers.
    pub fn tick(&mut self, host: &mut dyn Host) {
        if let Some(grace) = self.release_idle_namespaces {
            self.release_idle_namespaces(host, grace);
        }
        // Bounded memory: exited processes no failure names leave.
        let pinned = self.failures.pids();
        for pid in self.procs.reap(|pid| pinned.contains(&pid)) {
            self.files.forget_pid(pid);
            self.containers.forget(pid);
        }
        // Memory cgroups named by an id that was new at the event: the walk
        // runs at most once a second (the process may be gone by now).
        for (pid, id) in self.procs.unresolved_memcgs() {
            if let Some(m) = host.memcg_path(id) {
                self.procs.set_memcg(pid, Some(m));
            }
        }
        self.refresh_files(host);
        let mut devs = self.files.devs();
        // A failed mount stays while its namespace does; once that is let
        // go its use can no longer be read, and a last sample (often 100%)
        // must not stand for it in the live view and the metrics. The
        // report keeps it as it stood at its first failure.
        let mounts = &self.mounts;
        devs.extend(
            self.failures
                .touched_devs()
                .filter(|d| mounts.measure_at(*d).is_some()),
        );
        // Every known namespace's /dev/shm, files or not: its size matters
        // before anything fills it.
        let mut namespaces = host.anchored();
        namespaces.push(host.self_ns());
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
        self.mount_stats.retain(&devs);
        // Memory cgroups read this tick, at most 32 (each a few small reads).
        let mut memcg_reads: BTreeMap<(u8, String), Option<Memcg>> = BTreeMap::new();
        for dev in devs {
            let Some((ns, m)) = self.mounts.measure_at(dev).map(|(ns, m)| (ns, m.clone())) else {
                continue;
            };
            let usage = host.statfs(dev, ns, &m.mountpoint, &self.members_of(ns));
            let tracked = self.files.bytes_on(dev);
            let self_ns = host.self_ns();
            let shown = self.mounts.view(dev, None, self_ns).cloned().unwrap_or(m);
            let host_mp = self.mounts.host_mountpoint(dev, self_ns, &shown.mountpoint);
            self.mount_stats
                .observe(&shown, host_mp, ns, usage, tracked);
            let view_ns = self.mounts.view_ns(dev, self_ns);
            let headroom = self.memory_headroom(host, dev, &mut memcg_reads);
            let room = headroom.as_ref().map(|(_, room)| *room);
            self.mount_stats.set_memory_room(dev, view_ns, room, |s| {
                let size = s.size_bytes?;
                let (m, room) = headroom?;
                (size > room).then(|| {
                    // In a Kubernetes pod: which emptyDir rule made the size.
                    let pod_limit = headroom::pod_cgroup(&m.path)
                        .and_then(|p| headroom::memcg_cached(host, &mut memcg_reads, m.version, p))
                        .and_then(|p| p.limit_bytes);
                    headroom::Headroom {
                        size,
                        room,
                        memcg: m,
                        pod_limit,
                    }
                })
            });
        }
        self.name_containers(host);
        for pid in self.procs.pids() {
            let b = self.files.bytes_of(pid);
            let Some(p) = self.procs.get(pid) else {
                continue;
            };
            let (alive, cgid) = (p.alive(), p.cgroup_id);
            // Only a process with tmpfs bytes is worth a read of /proc (its
            // cgroup, its command line): the others cost nothing per start.
            let shown = b.allocated > 0 || b.held > 0 || b.peak_allocated > 0 || p.root;
            self.procs
                .set_bytes(pid, b.allocated, b.held, (b.peak_allocated, b.peak_held));
            if shown && alive {
                self.read_cmdline(host, pid);
            }
            let container = match self.container_of_id(host, cgid) {
                Some(c) => Some(c),
                None if alive && shown => self.container_of_pid(host, pid),
                None => self.containers.get(pid).cloned(),
            };
            if let Some(c) = container {
                self.procs.set_container(pid, c);
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
