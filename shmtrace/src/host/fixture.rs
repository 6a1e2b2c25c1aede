//! A host made of fixtures, for unit tests: nothing is read from the
//! machine. Tests fill in what /proc would say.

use std::collections::{BTreeMap, HashMap};

use super::{FdEntry, FileStat, Host, Limits, Lookup, MapsEntry, blocking::Stalls, memcg::Memcg};
use super::{
    cgroup::{Container, Names},
    mountinfo::{Mount, Usage},
};
use crate::event::{Addr, Dev};

pub const SELF_PID: u32 = 1;
pub const SELF_NS: u32 = 4026531840;

#[derive(Default)]
pub struct Fixture {
    pub stats: HashMap<u32, (u32, String)>,
    pub cmdlines: HashMap<u32, String>,
    pub namespaces: HashMap<u32, u32>,
    pub mounts: HashMap<u32, Vec<Mount>>,
    pub usage: HashMap<Dev, Usage>,
    pub maps: HashMap<u32, Vec<MapsEntry>>,
    pub fds: HashMap<u32, Vec<FdEntry>>,
    /// Files by (dev, ino): what stat says now.
    pub files: HashMap<(Dev, u64), FileStat>,
    /// Names on tmpfs mounts: (dev, name relative to the mount) -> inode.
    pub names: HashMap<(Dev, String), u64>,
    pub limits: HashMap<u32, Limits>,
    pub dirs: HashMap<u32, String>,
    pub cgroups: HashMap<u32, String>,
    pub cgroup_ids: HashMap<u64, String>,
    /// Namespaces anchored (ns -> anchor pid), and how many reads happened.
    pub anchors: BTreeMap<u32, u32>,
    pub released: Vec<u32>,
    /// pid -> its pid in its own PID namespace.
    pub ns_pids: HashMap<u32, u32>,
    /// pid -> (hierarchy version, memory cgroup path).
    pub memcgs: HashMap<u32, (u8, String)>,
    /// Memory cgroup id (as events carry it) -> (version, path).
    pub memcg_ids: HashMap<u64, (u8, String)>,
    /// (version, path) -> what the memory cgroup reads now.
    pub memcg_stats: HashMap<(u8, String), Memcg>,
    pub oom_lines: HashMap<u32, super::kmsg::OomLine>,
    /// cgroup path -> the container's and pod's names.
    pub container_names: HashMap<String, Names>,
    /// Reads that stalled, as the real host counts them.
    pub stalls: Stalls,
    /// The clock state reads; tests move it with `advance`.
    pub clock: Option<std::time::Instant>,
}

impl Fixture {
    /// Moves the fixture's clock on by `d`.
    pub fn advance(&mut self, d: std::time::Duration) {
        let now = self.now();
        self.clock = Some(now + d);
    }

    /// A host whose own namespace has a tmpfs /dev/shm `dev` of `size` bytes.
    pub fn with_shm(dev: Dev, size: u64) -> Self {
        let mut f = Self::default();
        f.mounts.insert(
            SELF_NS,
            vec![
                Mount {
                    dev: Dev::new(8, 1),
                    mountpoint: "/".into(),
                    fstype: "ext4".into(),
                    noexec: false,
                },
                Mount {
                    dev,
                    mountpoint: "/dev/shm".into(),
                    fstype: "tmpfs".into(),
                    noexec: false,
                },
            ],
        );
        f.usage.insert(
            dev,
            Usage {
                size_bytes: size,
                used_bytes: 0,
                inodes: 1000,
                inodes_used: 1,
            },
        );
        f
    }

    /// A file on tmpfs as stat would show it.
    pub fn file(&mut self, dev: Dev, ino: u64, size: i64, allocated: u64, nlink: u64) {
        self.files.insert(
            (dev, ino),
            FileStat {
                dev,
                ino,
                size,
                allocated,
                nlink,
                regular: true,
            },
        );
    }

    /// `pid` has `fd` open on the tmpfs file `ino` (a file stat shows as
    /// linked and empty until `file` says otherwise), as /proc lists it.
    pub fn open_fd(&mut self, pid: u32, fd: i32, dev: Dev, ino: u64) {
        if !self.files.contains_key(&(dev, ino)) {
            self.file(dev, ino, 0, 0, 1);
        }
        let stat = self.files[&(dev, ino)];
        let fds = self.fds.entry(pid).or_default();
        fds.retain(|e| e.fd != fd);
        fds.push(FdEntry {
            fd,
            stat,
            name: None,
        });
    }
}

impl Host for Fixture {
    fn now(&self) -> std::time::Instant {
        // Fixed until a test advances it.
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        self.clock
            .unwrap_or_else(|| *EPOCH.get_or_init(std::time::Instant::now))
    }
    fn self_pid(&self) -> u32 {
        SELF_PID
    }
    fn self_ns(&self) -> u32 {
        SELF_NS
    }
    fn proc_stat(&self, pid: u32) -> Option<(u32, String)> {
        self.stats.get(&pid).cloned()
    }
    fn has_exited(&self, pid: u32) -> bool {
        !self.stats.contains_key(&pid) && !self.fds.contains_key(&pid)
    }
    fn cmdline(&self, pid: u32) -> Option<String> {
        self.cmdlines.get(&pid).cloned()
    }
    fn mnt_ns(&self, pid: u32) -> Option<u32> {
        self.namespaces.get(&pid).copied()
    }
    fn mountinfo(&mut self, ns: u32, via: u32) -> Option<Vec<Mount>> {
        if ns != SELF_NS && ns != 0 {
            self.anchors.entry(ns).or_insert(via + 100_000);
        }
        self.mounts.get(&ns).cloned()
    }
    fn anchored(&self) -> Vec<u32> {
        self.anchors.keys().copied().collect()
    }
    fn anchor_of(&self, ns: u32) -> Option<u32> {
        if ns == SELF_NS {
            return Some(SELF_PID);
        }
        self.anchors.get(&ns).copied()
    }
    fn release(&mut self, ns: u32) {
        self.anchors.remove(&ns);
        self.released.push(ns);
    }
    fn statfs(&self, dev: Dev, _ns: u32, _mountpoint: &str, _via: &[u32]) -> Option<Usage> {
        self.usage.get(&dev).copied()
    }
    fn list(
        &self,
        dev: Dev,
        _ns: u32,
        _mountpoint: &str,
    ) -> Option<(Vec<(String, FileStat)>, u64)> {
        let files = self
            .names
            .iter()
            .filter(|((d, _), _)| *d == dev)
            .filter_map(|((_, name), ino)| Some((name.clone(), *self.files.get(&(dev, *ino))?)))
            .collect();
        Some((files, 0))
    }

    fn lookup(&self, dev: Dev, _ns: u32, _mountpoint: &str, rel: &str) -> Lookup {
        match self.names.get(&(dev, rel.to_string())) {
            Some(ino) => self
                .files
                .get(&(dev, *ino))
                .map_or(Lookup::Unknown, |st| Lookup::Found(*st)),
            None => Lookup::Missing,
        }
    }

    fn limits(&self, pid: u32) -> Limits {
        self.limits.get(&pid).copied().unwrap_or_default()
    }

    fn maps(&self, pid: u32) -> Vec<MapsEntry> {
        self.maps.get(&pid).cloned().unwrap_or_default()
    }
    fn fds(&self, pid: u32) -> Option<Vec<FdEntry>> {
        self.fds.get(&pid).cloned()
    }
    fn stat_fd(&self, pid: u32, fd: i32) -> Option<FileStat> {
        let e = self.fds.get(&pid)?.iter().find(|e| e.fd == fd)?;
        self.files
            .get(&(e.stat.dev, e.stat.ino))
            .copied()
            .or(Some(e.stat))
    }
    fn stat_mapped(&self, pid: u32, dev: Dev, ino: u64) -> Option<FileStat> {
        self.maps
            .get(&pid)?
            .iter()
            .any(|m| m.dev == dev && m.ino == ino)
            .then(|| self.files.get(&(dev, ino)).copied())?
    }
    fn stat_map_range(&self, pid: u32, start: Addr, end: Addr) -> Option<FileStat> {
        // As /proc/PID/map_files: the link exists for an exact range only.
        let m = self
            .maps
            .get(&pid)?
            .iter()
            .find(|m| (m.start, m.end) == (start, end))?;
        self.files.get(&(m.dev, m.ino)).copied()
    }
    fn dir_of(&self, pid: u32, _dirfd: Option<i32>) -> Option<String> {
        self.dirs.get(&pid).cloned()
    }
    fn cgroup(&self, pid: u32) -> Option<String> {
        self.cgroups.get(&pid).cloned()
    }
    fn cgroup_path(&mut self, id: u64) -> Option<String> {
        self.cgroup_ids.get(&id).cloned()
    }
    fn ns_pid(&self, pid: u32) -> Option<u32> {
        self.ns_pids.get(&pid).copied()
    }
    fn memcg_of(&self, pid: u32) -> Option<(u8, String)> {
        self.memcgs.get(&pid).cloned()
    }
    fn memcg_path(&mut self, id: u64) -> Option<(u8, String)> {
        self.memcg_ids.get(&id).cloned()
    }
    fn kernel_oom(&mut self, pid: u32) -> Option<super::kmsg::OomLine> {
        self.oom_lines.get(&pid).cloned()
    }
    fn memcg_at(&self, version: u8, path: &str) -> Option<Memcg> {
        self.memcg_stats.get(&(version, path.to_string())).cloned()
    }
    fn container_names(&self, c: &Container) -> Option<Names> {
        self.container_names.get(&c.cgroup).cloned()
    }
    fn stalls(&self) -> Stalls {
        self.stalls
    }
}
