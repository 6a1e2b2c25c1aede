//! The real host: /proc, statfs, stat, cgroupfs, and the namespace anchors.

use std::{collections::HashMap, path::Path, time::Instant};

use super::{
    FdEntry, FileStat, Host, Limits, Lookup, MapsEntry,
    anchors::Anchors,
    blocking::{Blocking, Stalls},
    procfs::*,
    runtimes,
};
use super::{
    cgroup::{Container, Names},
    mountinfo::{self, Mount, Usage},
};
use crate::{
    escape,
    event::{Addr, Dev},
};

pub struct ProcHost {
    self_pid: u32,
    self_ns: u32,
    anchors: Anchors,
    /// cgroup v2 id -> path, from the last walk of the hierarchy.
    cgroup_ids: HashMap<u64, String>,
    last_walk: Option<Instant>,
    /// Memory cgroup id -> (version, raw path), from walks of the
    /// hierarchy the memory controller is on.
    memcg_ids: super::memcg::IdCache,
    /// Reads that may block run here, with a timeout.
    io: Blocking,
    /// The kernel log from shmtrace's start, for OOM kills.
    kmsg: super::kmsg::Kmsg,
}

impl Default for ProcHost {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcHost {
    pub fn new() -> Self {
        let self_ns = mnt_ns_of("self").unwrap_or(0);
        Self {
            self_pid: std::process::id(),
            self_ns,
            anchors: Anchors::new(self_ns),
            cgroup_ids: HashMap::new(),
            last_walk: None,
            memcg_ids: Default::default(),
            io: Blocking::new(),
            kmsg: super::kmsg::Kmsg::open(),
        }
    }
}

impl Host for ProcHost {
    fn self_pid(&self) -> u32 {
        self.self_pid
    }

    fn self_ns(&self) -> u32 {
        self.self_ns
    }

    fn proc_stat(&self, pid: u32) -> Option<(u32, String)> {
        self.io
            .run(|| format!("stat {pid}"), move || read_stat(pid))
            .flatten()
    }

    fn cmdline(&self, pid: u32) -> Option<String> {
        self.io
            .run(|| format!("cmdline {pid}"), move || read_cmdline(pid))
            .flatten()
    }

    fn mnt_ns(&self, pid: u32) -> Option<u32> {
        // An nsfs link: answered by procfs itself, never by a filesystem.
        mnt_ns_of(&pid.to_string())
    }

    fn mountinfo(&mut self, ns: u32, via: u32) -> Option<Vec<Mount>> {
        let reader = self.anchors.ensure(ns, via).unwrap_or(via);
        self.io
            .run(
                || format!("mountinfo {reader}"),
                move || {
                    let text = std::fs::read_to_string(format!("/proc/{reader}/mountinfo")).ok()?;
                    Some(mountinfo::parse_mountinfo(&text))
                },
            )
            .flatten()
    }

    fn anchored(&self) -> Vec<u32> {
        self.anchors.namespaces()
    }

    fn anchor_of(&self, ns: u32) -> Option<u32> {
        self.anchors.get(ns)
    }

    fn release(&mut self, ns: u32) {
        self.anchors.release(ns);
    }

    fn statfs(&self, dev: Dev, ns: u32, mountpoint: &str, via: &[u32]) -> Option<Usage> {
        // The anchor (shmtrace itself for its own namespace) nearly always
        // answers; live processes of the namespace are the fallback.
        let through: Vec<u32> = self
            .anchors
            .get(ns)
            .into_iter()
            .chain(via.iter().copied())
            .collect();
        let mp = mountpoint.to_string();
        self.io
            .run(
                || format!("statfs {dev} {ns}"),
                move || statfs_through(dev, &mp, &through),
            )
            .flatten()
    }

    fn lookup(&self, dev: Dev, ns: u32, mountpoint: &str, rel: &str) -> Lookup {
        let Some(anchor) = self.anchors.get(ns) else {
            return Lookup::Unknown;
        };
        let root = format!("/proc/{anchor}/root{mountpoint}");
        let rel = rel.to_string();
        self.io
            .run(
                || format!("lookup {dev}"),
                move || lookup_under(dev, &root, &rel),
            )
            .unwrap_or(Lookup::Unknown)
    }

    fn list(&self, dev: Dev, ns: u32, mountpoint: &str) -> Option<(Vec<(String, FileStat)>, u64)> {
        let anchor = self.anchors.get(ns)?;
        let root = format!("/proc/{anchor}/root{mountpoint}");
        self.io
            .run(
                || format!("list {dev}"),
                move || super::listing::list_under(dev, &root),
            )
            .flatten()
    }

    fn ns_pid(&self, pid: u32) -> Option<u32> {
        self.io
            .run(|| format!("status {pid}"), move || ns_pid_of(pid))
            .flatten()
    }

    fn limits(&self, pid: u32) -> Limits {
        self.io
            .run(|| format!("limits {pid}"), move || limits_of(pid))
            .unwrap_or_default()
    }

    fn maps(&self, pid: u32) -> Vec<MapsEntry> {
        self.io
            .run(|| format!("maps {pid}"), move || maps_of(pid))
            .unwrap_or_default()
    }

    fn has_exited(&self, pid: u32) -> bool {
        self.io
            .run(|| format!("stat {pid}"), move || has_exited(pid))
            .unwrap_or(false)
    }

    fn fds(&self, pid: u32) -> Option<Vec<FdEntry>> {
        self.io
            .run(|| format!("fds {pid}"), move || fds_of(pid))
            .flatten()
    }

    fn stat_fd(&self, pid: u32, fd: i32) -> Option<FileStat> {
        let path = format!("/proc/{pid}/fd/{fd}");
        let key = path.clone();
        self.io.run(|| key, move || stat_path(&path)).flatten()
    }

    fn stat_mapped(&self, pid: u32, dev: Dev, ino: u64) -> Option<FileStat> {
        // map_files links are named by the kernel's VMA, which may have
        // merged several of our mappings: take the range from /proc.
        self.io
            .run(
                || format!("maps {pid}"),
                move || {
                    maps_of(pid)
                        .into_iter()
                        .filter(|m| m.dev == dev && m.ino == ino)
                        .find_map(|m| stat_path(&map_file(pid, m.start, m.end)))
                        .filter(|st| st.ino == ino)
                },
            )
            .flatten()
    }

    fn stat_map_range(&self, pid: u32, start: Addr, end: Addr) -> Option<FileStat> {
        let path = map_file(pid, start, end);
        self.io
            .run(|| format!("maps {pid}"), move || stat_path(&path))
            .flatten()
    }

    fn dir_of(&self, pid: u32, dirfd: Option<i32>) -> Option<String> {
        // readlink of a /proc link prints a path the kernel already has:
        // no filesystem is asked.
        let link = match dirfd {
            Some(fd) => format!("/proc/{pid}/fd/{fd}"),
            None => format!("/proc/{pid}/cwd"),
        };
        std::fs::read_link(link)
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
    }

    fn container_names(&self, c: &Container) -> Option<Names> {
        let (c, key) = (c.clone(), format!("names {}", c.cgroup));
        self.io
            .run(|| key, move || runtimes::names(Path::new("/"), &c))
            .flatten()
    }

    fn memcg_of(&self, pid: u32) -> Option<(u8, String)> {
        self.io
            .run(
                || format!("memcg of {pid}"),
                move || super::memcg::locate(Path::new("/"), pid),
            )
            .flatten()
    }

    fn memcg_path(&mut self, id: u64) -> Option<(u8, String)> {
        let io = &self.io;
        // A walk of cgroupfs, off the event loop like any read of the machine.
        self.memcg_ids.lookup(id, Instant::now(), || {
            io.run(|| "memcg walk".into(), || super::memcg::ids(Path::new("/")))
        })
    }

    fn kernel_oom(&mut self, pid: u32) -> Option<super::kmsg::OomLine> {
        self.kmsg.oom_line(pid)
    }

    fn memcg_at(&self, version: u8, path: &str) -> Option<super::memcg::Memcg> {
        let (p, key) = (path.to_string(), format!("memcg {path}"));
        self.io
            .run(
                || key,
                move || super::memcg::read_at(Path::new("/"), version, &p),
            )
            .flatten()
    }

    fn cgroup(&self, pid: u32) -> Option<String> {
        self.io
            .run(
                || format!("cgroup {pid}"),
                move || {
                    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
                    // Anyone who may create a cgroup names it: escaped like any name.
                    Some(escape::str(&container_cgroup(&text)))
                },
            )
            .flatten()
    }

    fn cgroup_path(&mut self, id: u64) -> Option<String> {
        if !self.cgroup_ids.contains_key(&id)
            && self.last_walk.is_none_or(|t| t.elapsed().as_secs() >= 1)
        {
            self.last_walk = Some(Instant::now());
            // Rebuilt each walk: cgroups removed since leave the map.
            self.cgroup_ids.clear();
            if let Some(root) = v2_root() {
                let root = Path::new(root);
                walk(root, root, &mut self.cgroup_ids, 0, &escape::bytes);
            }
        }
        self.cgroup_ids.get(&id).cloned()
    }

    fn stalls(&self) -> Stalls {
        self.io.stalls()
    }
}
