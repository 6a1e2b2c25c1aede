//! Who holds the bytes: tmpfs files by (device, inode), named or unlinked,
//! with the processes that created them, allocated their pages, and keep
//! them alive now by an fd or a mapping.
//!
//! Events say which files exist and who opens, maps, closes and unmaps
//! them; a once-a-second refresh stats only those files (through a holder's
//! /proc/PID/fd or map_files link) for their allocated blocks, and rescans
//! the fds of processes whose events hint at fds we could not see (fds
//! received over unix sockets, dup, fork).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::procs::MappingTable;

pub type FileKey = (u32, u64);

#[derive(Clone, Debug, Serialize)]
pub struct FileState {
    pub dev: String,
    #[serde(skip)]
    pub kdev: u32,
    pub ino: u64,
    /// Name as the kernel or /proc gave it (escaped).
    pub name: Option<String>,
    pub size: i64,
    /// Bytes of pages allocated to the file (st_blocks * 512).
    pub allocated_bytes: u64,
    pub unlinked: bool,
    pub creator: Option<u32>,
    /// Bytes of its pages credited to each process that allocated them.
    pub allocated_by: BTreeMap<u32, u64>,
    /// Processes that hold it now by an fd, and by a mapping.
    pub fd_holders: BTreeSet<u32>,
    pub map_holders: BTreeSet<u32>,
    #[serde(skip)]
    fds: BTreeSet<(u32, i32)>,
}

impl FileState {
    fn new(kdev: u32, ino: u64) -> Self {
        Self {
            dev: crate::mounts::kdev_string(kdev),
            kdev,
            ino,
            name: None,
            size: 0,
            allocated_bytes: 0,
            unlinked: false,
            creator: None,
            allocated_by: BTreeMap::new(),
            fd_holders: BTreeSet::new(),
            map_holders: BTreeSet::new(),
            fds: BTreeSet::new(),
        }
    }

    pub fn holders(&self) -> BTreeSet<u32> {
        self.fd_holders.union(&self.map_holders).copied().collect()
    }
}

/// What the kernel (or stat) said about a file at one moment.
pub struct Seen<'a> {
    pub name: Option<&'a str>,
    pub size: i64,
    pub allocated: u64,
    pub unlinked: bool,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct ProcBytes {
    pub allocated: u64,
    pub held: u64,
    pub peak_allocated: u64,
    pub peak_held: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Segments {
    pub max_bytes: u64,
    pub creators: BTreeSet<u32>,
}

#[derive(Default)]
pub struct Attribution {
    pub files: HashMap<FileKey, FileState>,
    fd_index: HashMap<(u32, i32), FileKey>,
    /// Per process, as of the last tick: bytes allocated and held, and peaks.
    pub bytes: HashMap<u32, ProcBytes>,
    /// Over the whole run, freed files included: the largest file seen and
    /// who created files of 1 MiB or more (what a DataLoader's batches look like).
    pub segments: Segments,
    rescan: BTreeSet<u32>,
}

impl Attribution {
    /// A file seen in an event of `pid`: keep its latest numbers, and credit
    /// growth since the last look to whoever allocates it (see `credit`).
    pub fn seen(&mut self, key: FileKey, s: Seen, pid: u32) {
        let f = self
            .files
            .entry(key)
            .or_insert_with(|| FileState::new(key.0, key.1));
        if let Some(n) = s.name {
            f.name = Some(n.to_string());
        }
        f.size = s.size;
        f.unlinked = s.unlinked;
        let grown = s.allocated.saturating_sub(f.allocated_bytes);
        f.allocated_bytes = s.allocated;
        credit(f, grown, pid);
        let (size, creator) = (f.size.max(0) as u64, f.creator);
        self.segments.max_bytes = self.segments.max_bytes.max(size);
        if let Some(c) = creator.filter(|_| size >= 1 << 20) {
            self.segments.creators.insert(c);
        }
    }

    pub fn opened(&mut self, pid: u32, fd: i32, key: FileKey, created: bool) {
        if let Some(old) = self.fd_index.insert((pid, fd), key)
            && old != key
            && let Some(f) = self.files.get_mut(&old)
        {
            f.fds.remove(&(pid, fd));
            refresh_fd_holders(f);
        }
        let f = self
            .files
            .entry(key)
            .or_insert_with(|| FileState::new(key.0, key.1));
        if created && f.creator.is_none() {
            f.creator = Some(pid);
        }
        f.fds.insert((pid, fd));
        f.fd_holders.insert(pid);
    }

    pub fn closed(&mut self, pid: u32, fd: i32) {
        if let Some(key) = self.fd_index.remove(&(pid, fd))
            && let Some(f) = self.files.get_mut(&key)
        {
            f.fds.remove(&(pid, fd));
            refresh_fd_holders(f);
        }
    }

    /// Everything `pid` held by fd is gone (exit).
    pub fn gone(&mut self, pid: u32) {
        let fds: Vec<(u32, i32)> = self
            .fd_index
            .keys()
            .filter(|k| k.0 == pid)
            .copied()
            .collect();
        for (p, fd) in fds {
            self.closed(p, fd);
        }
        self.rescan.remove(&pid);
    }

    /// A child inherits its parent's fds; a rescan corrects CLOEXEC ones.
    pub fn forked(&mut self, parent: u32, child: u32) {
        let inherited: Vec<(i32, FileKey)> = self
            .fd_index
            .iter()
            .filter(|(k, _)| k.0 == parent)
            .map(|(k, v)| (k.1, *v))
            .collect();
        for (fd, key) in inherited {
            self.opened(child, fd, key, false);
        }
        self.rescan.insert(child);
    }

    /// The tmpfs `kdev` is gone (its namespace was let go): drop its files.
    pub fn forget_dev(&mut self, kdev: u32) {
        self.files.retain(|_, f| f.kdev != kdev);
        let files = &self.files;
        self.fd_index.retain(|_, key| files.contains_key(key));
    }

    pub fn want_rescan(&mut self, pid: u32) {
        self.rescan.insert(pid);
    }

    /// Re-reads the fds of processes flagged since the last tick, and the
    /// allocated size of every tracked file; drops freed files.
    pub fn tick(&mut self, maps: &MappingTable, is_tmpfs: impl Fn(u32) -> bool) {
        for pid in std::mem::take(&mut self.rescan) {
            self.rescan_fds(pid, &is_tmpfs);
        }
        let by_map = maps.holders();
        let mut freed = Vec::new();
        for (key, f) in self.files.iter_mut() {
            f.map_holders = by_map.get(key).cloned().unwrap_or_default();
            if let Some(st) = stat_through_holder(f, maps) {
                let allocated = st.st_blocks as u64 * 512;
                let grown = allocated.saturating_sub(f.allocated_bytes);
                f.allocated_bytes = allocated;
                f.size = st.st_size;
                f.unlinked = st.st_nlink == 0;
                let hint = f.holders().into_iter().next().unwrap_or(0);
                credit(f, grown, hint);
            } else if f.holders().is_empty() && f.unlinked {
                freed.push(*key); // last reference gone: tmpfs freed its pages
            }
        }
        for k in freed {
            self.files.remove(&k);
        }
        self.update_bytes();
    }

    /// Every process's allocated and held bytes, in one pass over the files.
    fn update_bytes(&mut self) {
        let mut now: HashMap<u32, (u64, u64)> = HashMap::new();
        for f in self.files.values() {
            for (pid, b) in &f.allocated_by {
                now.entry(*pid).or_default().0 += b;
            }
            for pid in f.holders() {
                now.entry(pid).or_default().1 += f.allocated_bytes;
            }
        }
        for e in self.bytes.values_mut() {
            (e.allocated, e.held) = (0, 0);
        }
        for (pid, (allocated, held)) in now {
            let e = self.bytes.entry(pid).or_default();
            (e.allocated, e.held) = (allocated, held);
            e.peak_allocated = e.peak_allocated.max(allocated);
            e.peak_held = e.peak_held.max(held);
        }
    }

    fn rescan_fds(&mut self, pid: u32, is_tmpfs: &impl Fn(u32) -> bool) {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return;
        };
        let mut found = Vec::new();
        for e in dir.flatten() {
            let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(st) = nix::sys::stat::stat(&e.path()) else {
                continue;
            };
            let kdev = crate::mounts::kdev(libc::major(st.st_dev), libc::minor(st.st_dev));
            if (st.st_mode & libc::S_IFMT) != libc::S_IFREG || !is_tmpfs(kdev) {
                continue;
            }
            let name = std::fs::read_link(e.path()).ok().map(|l| {
                let s = l.to_string_lossy().into_owned();
                let s = s.trim_end_matches(" (deleted)");
                crate::escape::str(s.rsplit('/').next().unwrap_or(s))
            });
            found.push((fd, (kdev, st.st_ino), st, name));
        }
        let stale: Vec<i32> = self
            .fd_index
            .keys()
            .filter(|k| k.0 == pid && !found.iter().any(|f| f.0 == k.1))
            .map(|k| k.1)
            .collect();
        for fd in stale {
            self.closed(pid, fd);
        }
        for (fd, key, st, name) in found {
            self.opened(pid, fd, key, false);
            let f = self.files.get_mut(&key).expect("just opened");
            if f.name.is_none() {
                f.name = name;
            }
            f.size = st.st_size;
            f.unlinked = st.st_nlink == 0;
            let allocated = st.st_blocks as u64 * 512;
            let grown = allocated.saturating_sub(f.allocated_bytes);
            f.allocated_bytes = allocated;
            credit(f, grown, pid);
        }
    }

    /// Bytes held by any process of `pids`, each file counted once.
    pub fn held_by_any(&self, pids: &BTreeSet<u32>) -> u64 {
        self.files
            .values()
            .filter(|f| f.holders().iter().any(|p| pids.contains(p)))
            .map(|f| f.allocated_bytes)
            .sum()
    }

    /// Processes holding files on tmpfs `kdev`, with the bytes each holds
    /// there, largest first.
    pub fn holders_on(&self, kdev: u32) -> Vec<(u32, u64)> {
        let mut by: BTreeMap<u32, u64> = BTreeMap::new();
        for f in self.files.values().filter(|f| f.kdev == kdev) {
            for pid in f.holders() {
                *by.entry(pid).or_default() += f.allocated_bytes;
            }
        }
        let mut v: Vec<(u32, u64)> = by.into_iter().collect();
        v.sort_by_key(|&(pid, b)| (std::cmp::Reverse(b), pid));
        v
    }

    /// Bytes of tracked files on tmpfs `kdev`.
    pub fn bytes_on(&self, kdev: u32) -> u64 {
        self.files
            .values()
            .filter(|f| f.kdev == kdev)
            .map(|f| f.allocated_bytes)
            .sum()
    }

    pub fn devs(&self) -> BTreeSet<u32> {
        self.files.values().map(|f| f.kdev).collect()
    }
}

fn refresh_fd_holders(f: &mut FileState) {
    f.fd_holders = f.fds.iter().map(|(p, _)| *p).collect();
}

/// Growth of a file's pages is credited to its creator while the creator
/// still holds it (PyTorch's worker creates and fills its segment before
/// sending it), else to the process that revealed it. Credits never exceed
/// the file's allocation: shrinking takes from the latest ones first.
fn credit(f: &mut FileState, grown: u64, hint: u32) {
    if grown > 0 {
        let who = match f.creator {
            Some(c) if f.holders().contains(&c) || f.holders().is_empty() => c,
            _ if hint != 0 => hint,
            Some(c) => c,
            None => return,
        };
        *f.allocated_by.entry(who).or_default() += grown;
    }
    let mut total: u64 = f.allocated_by.values().sum();
    while total > f.allocated_bytes {
        let Some((&pid, v)) = f.allocated_by.iter_mut().next_back() else {
            break;
        };
        let cut = (total - f.allocated_bytes).min(*v);
        *v -= cut;
        total -= cut;
        if *v == 0 {
            f.allocated_by.remove(&pid);
        }
    }
}

/// stat of the file through any holder: an fd link, else a map_files link.
fn stat_through_holder(f: &FileState, maps: &MappingTable) -> Option<nix::sys::stat::FileStat> {
    let ok = |st: &nix::sys::stat::FileStat| st.st_ino == f.ino;
    for (pid, fd) in &f.fds {
        if let Ok(st) = nix::sys::stat::stat(format!("/proc/{pid}/fd/{fd}").as_str())
            && ok(&st)
        {
            return Some(st);
        }
    }
    let _ = maps;
    for pid in &f.map_holders {
        // map_files links are named by the kernel's VMA, which may have
        // merged several of our mappings: take the range from /proc.
        let vmas = crate::procs::scan_maps(*pid, |dev| dev == f.kdev);
        for m in vmas.iter().filter(|m| m.ino == f.ino) {
            let path = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
            if let Ok(st) = nix::sys::stat::stat(path.as_str())
                && ok(&st)
            {
                return Some(st);
            }
        }
    }
    None
}
