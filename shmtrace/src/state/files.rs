//! Who holds the bytes: tmpfs files by (device, inode), named or unlinked,
//! with the processes that created them, allocated their pages, and keep
//! them alive now by an fd or a mapping.
//!
//! Events say which files exist and who creates, maps and unmaps them;
//! once a second (and at a failure) the state asks the host whether each
//! fd it tracks still is that file (closes are not hooked), to stat only
//! those files (through a holder) for their allocated blocks, and to list
//! the fds of processes whose events hint at fds we could not see (fds
//! received over unix sockets, a tracked fd gone, which a copy made by dup
//! or fcntl may outlive, fork). This component only keeps the books.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::Serialize;

use crate::{
    event::{Dev, FileKey},
    host::{FdEntry, FileStat, Lookup},
};

/// Files tracked at most. Beyond it, files nobody holds go first (counted).
pub const MAX_FILES: usize = 16384;

#[derive(Clone, Debug, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct FileState {
    pub dev: Dev,
    /// Its inode number.
    pub ino: u64,
    /// Name as the kernel or /proc gave it (escaped).
    pub name: Option<String>,
    /// Its size (st_size) as last seen.
    pub size: i64,
    /// Bytes of pages allocated to the file (st_blocks * 512).
    pub allocated_bytes: u64,
    /// Whether it was removed while still open or mapped (it keeps its pages until the last holder lets go).
    pub unlinked: bool,
    /// The process that created it, when a traced one did.
    pub creator: Option<u32>,
    /// Bytes of its pages credited to each process that allocated them.
    pub allocated_by: BTreeMap<u32, u64>,
    /// Processes that hold it now by an fd, and by a mapping.
    pub fd_holders: BTreeSet<u32>,
    /// Processes that map it.
    pub map_holders: BTreeSet<u32>,
    #[serde(skip)]
    fds: BTreeSet<(u32, i32)>,
}

impl FileState {
    fn new(dev: Dev, ino: u64) -> Self {
        Self {
            dev,
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
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Segments {
    /// The largest segment's bytes.
    pub max_bytes: u64,
    /// Processes that created segments.
    pub creators: BTreeSet<u32>,
}

#[derive(Default)]
pub struct Files {
    files: HashMap<FileKey, FileState>,
    fd_index: HashMap<(u32, i32), FileKey>,
    /// Per process, as of the last tick: bytes allocated and held, and peaks.
    bytes: HashMap<u32, ProcBytes>,
    /// Over the whole run, freed files included: the largest file seen and
    /// who created files of 1 MiB or more (what a DataLoader's batches look like).
    segments: Segments,
    rescan: BTreeSet<u32>,
    /// Files let go over the cap, nobody holding them.
    dropped: u64,
}

impl Files {
    /// Every tracked file, in (device, inode) order.
    pub fn all(&self) -> Vec<&FileState> {
        let mut v: Vec<&FileState> = self.files.values().collect();
        v.sort_unstable_by_key(|f| (f.dev, f.ino));
        v
    }

    /// Tracked files on tmpfs `dev`.
    pub fn on(&self, dev: Dev) -> impl Iterator<Item = &FileState> {
        self.files.values().filter(move |f| f.dev == dev)
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    pub fn get(&self, key: FileKey) -> Option<&FileState> {
        self.files.get(&key)
    }

    pub fn contains(&self, key: FileKey) -> bool {
        self.files.contains_key(&key)
    }

    /// Processes with bytes on the books.
    pub fn procs_counted(&self) -> usize {
        self.bytes.len()
    }

    /// `pid`'s bytes as of the last tick.
    pub fn bytes_of(&self, pid: u32) -> ProcBytes {
        self.bytes.get(&pid).copied().unwrap_or_default()
    }

    /// Over the whole run, freed files included.
    pub fn segments(&self) -> &Segments {
        &self.segments
    }

    /// Files let go over the cap.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

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

    /// `pid` created the file `key` by an open whose fd is not known yet
    /// (the trampoline backend's create hook runs before the fd exists).
    /// It holds the file under a placeholder fd, negative and one per
    /// file, until a listing of its fds replaces it: as a known fd would,
    /// it stays when the process is gone before that listing (its exit not
    /// yet applied), and goes when a listing does not find the file.
    pub fn created(&mut self, pid: u32, key: FileKey) {
        let placeholder = -1 - (key.1 % (1 << 30)) as i32;
        self.opened(pid, placeholder, key, true);
    }

    /// Whether `fd` is a placeholder of [`Files::created`].
    pub fn is_placeholder(fd: i32) -> bool {
        fd < 0
    }

    pub fn closed(&mut self, pid: u32, fd: i32) {
        if let Some(key) = self.fd_index.remove(&(pid, fd))
            && let Some(f) = self.files.get_mut(&key)
        {
            f.fds.remove(&(pid, fd));
            refresh_fd_holders(f);
        }
    }

    /// Every tracked fd, with the file it was: closes are not hooked, so
    /// each is checked once a second and at a failure.
    pub fn fd_checks(&self) -> Vec<(u32, i32, FileKey)> {
        self.fd_index
            .iter()
            .map(|(&(pid, fd), &key)| (pid, fd, key))
            .collect()
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
        // A child of a process holding no tmpfs fd holds none either: no
        // rescan (every fork on the node comes here).
        if inherited.is_empty() {
            return;
        }
        for (fd, key) in inherited {
            self.opened(child, fd, key, false);
        }
        self.rescan.insert(child);
    }

    /// An exited process left the process tree: its totals go too.
    pub fn forget_pid(&mut self, pid: u32) {
        self.bytes.remove(&pid);
        self.rescan.remove(&pid);
    }

    /// Named files no holder could measure this round (`measured`): nobody
    /// holds them, or every holder's fd and mapping failed to answer (it
    /// exited before its exit event was applied, as the processes of a
    /// short job are by the time its first failure is). Their name, looked
    /// up relative to their mount (unescaped), tells their size, or that
    /// they were unlinked.
    pub fn unmeasured_named(&self, measured: &HashSet<FileKey>) -> Vec<(FileKey, String)> {
        self.files
            .iter()
            .filter(|(k, f)| !f.unlinked && !measured.contains(k))
            .filter_map(|(k, f)| {
                let n = f.name.as_deref()?;
                // Escaped names and cut paths (".../") cannot be looked up.
                (!n.contains('\\') && !n.starts_with("...")).then(|| (*k, n.to_string()))
            })
            .collect()
    }

    /// Files of `pids` (made or held by one of them) that still have a
    /// name we can look up: measured by name when their holders are gone.
    pub fn named_of(&self, pids: &BTreeSet<u32>) -> Vec<(FileKey, String)> {
        self.files
            .iter()
            .filter(|(_, f)| !f.unlinked)
            .filter(|(_, f)| {
                f.creator.is_some_and(|c| pids.contains(&c))
                    || f.holders().iter().any(|p| pids.contains(p))
            })
            .filter_map(|(k, f)| {
                let n = f.name.as_deref()?;
                (!n.contains('\\') && !n.starts_with("...")).then(|| (*k, n.to_string()))
            })
            .collect()
    }

    /// What a lookup by name found of a file. Gone or another file under
    /// the name: it was unlinked, so freed if nobody holds it, else alive
    /// until its last holder lets go.
    pub fn looked_up(&mut self, key: FileKey, found: Lookup) {
        let Some(f) = self.files.get_mut(&key) else {
            return;
        };
        match found {
            Lookup::Found(st) if st.ino == key.1 => {
                let grown = st.allocated.saturating_sub(f.allocated_bytes);
                f.allocated_bytes = st.allocated;
                f.size = st.size;
                credit(f, grown, 0);
            }
            Lookup::Found(_) | Lookup::Missing if f.holders().is_empty() => {
                self.files.remove(&key);
            }
            Lookup::Found(_) | Lookup::Missing => f.unlinked = true,
            Lookup::Unknown => {}
        }
    }

    /// Keeps the table under [`MAX_FILES`]: files nobody holds go first.
    pub fn trim(&mut self) {
        if self.files.len() <= MAX_FILES {
            return;
        }
        let over = self.files.len() - MAX_FILES;
        let unheld: Vec<FileKey> = self
            .files
            .iter()
            .filter(|(_, f)| f.holders().is_empty())
            .map(|(k, _)| *k)
            .take(over)
            .collect();
        for k in unheld {
            self.files.remove(&k);
            self.dropped += 1;
        }
        let files = &self.files;
        self.fd_index.retain(|_, key| files.contains_key(key));
    }

    /// The tmpfs `dev` is gone (its namespace was let go): drop its files.
    pub fn forget_dev(&mut self, dev: Dev) {
        self.files.retain(|_, f| f.dev != dev);
        let files = &self.files;
        self.fd_index.retain(|_, key| files.contains_key(key));
    }

    /// Whether `pid` is known to hold a tmpfs fd (inherited ones
    /// included): only then is its exec worth a rescan of its fds.
    pub fn holds_fds(&self, pid: u32) -> bool {
        self.fd_index.keys().any(|(p, _)| *p == pid)
    }

    pub fn want_rescan(&mut self, pid: u32) {
        self.rescan.insert(pid);
    }

    /// Processes whose fds should be listed now (flagged since the last tick).
    pub fn take_rescans(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.rescan).into_iter().collect()
    }

    /// Who maps each file now, from the mapping table.
    pub fn set_map_holders(&mut self, by_map: &HashMap<FileKey, BTreeSet<u32>>) {
        for (key, f) in self.files.iter_mut() {
            f.map_holders = by_map.get(key).cloned().unwrap_or_default();
        }
    }

    /// Every tracked file with the processes that map it: a file the fd
    /// checks and rescans did not measure is stat'ed through a mapping.
    pub fn stat_plan(&self) -> Vec<(FileKey, Vec<u32>)> {
        self.files
            .iter()
            .map(|(key, f)| (*key, f.map_holders.iter().copied().collect()))
            .collect()
    }

    /// What stat said of a tracked file now (None: no holder could tell).
    /// A file nobody holds that is unlinked is freed: tmpfs let its pages go.
    pub fn measured(&mut self, key: FileKey, st: Option<FileStat>) {
        let Some(f) = self.files.get_mut(&key) else {
            return;
        };
        match st {
            Some(st) if st.ino == f.ino => {
                let grown = st.allocated.saturating_sub(f.allocated_bytes);
                f.allocated_bytes = st.allocated;
                f.size = st.size;
                f.unlinked = st.nlink == 0;
                let hint = f.holders().into_iter().next().unwrap_or(0);
                credit(f, grown, hint);
            }
            _ if f.holders().is_empty() && f.unlinked => {
                self.files.remove(&key);
            }
            _ => {}
        }
    }

    /// The fds `pid` has now (from the host): tmpfs ones are holders, fds we
    /// thought it had and it has not are closed. Returns the files found
    /// (measured by the listing's stats).
    pub fn rescanned(
        &mut self,
        pid: u32,
        found: Vec<FdEntry>,
        is_tmpfs: impl Fn(Dev) -> bool,
    ) -> Vec<FileKey> {
        let found: Vec<FdEntry> = found
            .into_iter()
            .filter(|e| e.stat.regular && is_tmpfs(e.stat.dev))
            .collect();
        let stale: Vec<i32> = self
            .fd_index
            .keys()
            .filter(|k| k.0 == pid && !found.iter().any(|f| f.fd == k.1))
            .map(|k| k.1)
            .collect();
        for fd in stale {
            self.closed(pid, fd);
        }
        let mut keys = Vec::with_capacity(found.len());
        for e in found {
            let key = (e.stat.dev, e.stat.ino);
            keys.push(key);
            self.opened(pid, e.fd, key, false);
            let f = self.files.get_mut(&key).expect("just opened");
            if f.name.is_none() {
                f.name = e.name;
            }
            f.size = e.stat.size;
            f.unlinked = e.stat.nlink == 0;
            let grown = e.stat.allocated.saturating_sub(f.allocated_bytes);
            f.allocated_bytes = e.stat.allocated;
            credit(f, grown, pid);
        }
        keys
    }

    /// Every process's allocated and held bytes, in one pass over the files.
    pub fn update_bytes(&mut self) {
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

    /// Bytes held by any process of `pids`, each file counted once.
    pub fn held_by_any(&self, pids: &BTreeSet<u32>) -> u64 {
        self.files
            .values()
            .filter(|f| f.holders().iter().any(|p| pids.contains(p)))
            .map(|f| f.allocated_bytes)
            .sum()
    }

    /// Processes holding files on tmpfs `dev`, with the bytes each holds
    /// there, largest first.
    pub fn holders_on(&self, dev: Dev) -> Vec<(u32, u64)> {
        self.holders_shared_on(dev)
            .into_iter()
            .map(|(pid, held, _)| (pid, held))
            .collect()
    }

    /// [`Files::holders_on`] with, for each holder, the part of its bytes
    /// in files another process holds too (a segment mapped by several):
    /// (pid, held, shared), most held first.
    pub fn holders_shared_on(&self, dev: Dev) -> Vec<(u32, u64, u64)> {
        let mut by: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for f in self.files.values().filter(|f| f.dev == dev) {
            let holders = f.holders();
            let shared = holders.len() > 1;
            for pid in holders {
                let e = by.entry(pid).or_default();
                e.0 += f.allocated_bytes;
                if shared {
                    e.1 += f.allocated_bytes;
                }
            }
        }
        let mut v: Vec<(u32, u64, u64)> = by.into_iter().map(|(p, (h, s))| (p, h, s)).collect();
        v.sort_by_key(|&(pid, b, _)| (std::cmp::Reverse(b), pid));
        v
    }

    /// Bytes of tracked files on tmpfs `dev`.
    pub fn bytes_on(&self, dev: Dev) -> u64 {
        self.files
            .values()
            .filter(|f| f.dev == dev)
            .map(|f| f.allocated_bytes)
            .sum()
    }

    pub fn devs(&self) -> BTreeSet<Dev> {
        self.files.values().map(|f| f.dev).collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    const SHM: Dev = Dev(40);
    const MIB: u64 = 1 << 20;

    fn seen(files: &mut Files, ino: u64, allocated: u64, pid: u32) {
        files.seen(
            (SHM, ino),
            Seen {
                name: Some("seg"),
                size: allocated as i64,
                allocated,
                unlinked: false,
            },
            pid,
        );
    }

    #[test]
    fn growth_is_credited_to_the_creator_while_it_holds_the_file() {
        let mut fs = Files::default();
        fs.opened(10, 3, (SHM, 1), true);
        fs.opened(11, 4, (SHM, 1), false);
        seen(&mut fs, 1, 4 * MIB, 11);
        let f = fs.get((SHM, 1)).unwrap();
        assert_eq!(
            f.allocated_by.get(&10),
            Some(&(4 * MIB)),
            "the creator holds it"
        );
        // The creator let go: the next growth is the writer's.
        fs.closed(10, 3);
        seen(&mut fs, 1, 6 * MIB, 11);
        let f = fs.get((SHM, 1)).unwrap();
        assert_eq!(
            (f.allocated_by[&10], f.allocated_by[&11]),
            (4 * MIB, 2 * MIB)
        );
        // Shrinking takes from the last credited first.
        seen(&mut fs, 1, 3 * MIB, 11);
        let f = fs.get((SHM, 1)).unwrap();
        assert_eq!(f.allocated_by.values().sum::<u64>(), 3 * MIB);
    }

    #[test]
    fn holders_follow_opens_closes_forks_and_exits() {
        let mut fs = Files::default();
        fs.opened(10, 3, (SHM, 1), true);
        fs.forked(10, 12);
        assert_eq!(fs.get((SHM, 1)).unwrap().fd_holders, [10, 12].into());
        assert_eq!(
            fs.take_rescans(),
            vec![12],
            "a child's CLOEXEC fds are checked"
        );
        fs.gone(10);
        assert_eq!(fs.get((SHM, 1)).unwrap().fd_holders, [12].into());
        // An fd number reused for another file leaves the first.
        fs.opened(12, 3, (SHM, 2), true);
        assert!(fs.get((SHM, 1)).unwrap().fd_holders.is_empty());
        assert_eq!(fs.holders_on(SHM), vec![(12, 0)]);
    }

    #[test]
    fn per_process_bytes_keep_their_peaks_and_shared_files_count_once() {
        let mut fs = Files::default();
        fs.opened(10, 3, (SHM, 1), true);
        fs.opened(11, 3, (SHM, 1), false);
        seen(&mut fs, 1, 8 * MIB, 10);
        fs.update_bytes();
        assert_eq!(
            (fs.bytes_of(10).held, fs.bytes_of(11).held),
            (8 * MIB, 8 * MIB)
        );
        assert_eq!(fs.held_by_any(&[10, 11].into()), 8 * MIB, "one file, once");
        seen(&mut fs, 1, 2 * MIB, 10);
        fs.update_bytes();
        let b = fs.bytes_of(10);
        assert_eq!(
            (b.held, b.peak_held, b.peak_allocated),
            (2 * MIB, 8 * MIB, 8 * MIB)
        );
        assert_eq!(fs.bytes_on(SHM), 2 * MIB);
        assert_eq!(fs.segments().max_bytes, 8 * MIB);
        assert_eq!(fs.segments().creators, [10].into());
    }

    #[test]
    fn unheld_files_are_looked_up_by_plain_names_only_and_trimmed_first() {
        let mut fs = Files::default();
        for (ino, name) in [(1, "ok"), (2, "bad\\x0aname"), (3, ".../deep/x")] {
            fs.seen(
                (SHM, ino),
                Seen {
                    name: Some(name),
                    size: 1,
                    allocated: 4096,
                    unlinked: false,
                },
                9,
            );
        }
        let names: Vec<String> = fs
            .unmeasured_named(&HashSet::new())
            .into_iter()
            .map(|(_, n)| n)
            .collect();
        assert_eq!(names, vec!["ok".to_string()]);
        // Its name is gone: unlinked with nobody holding it, freed.
        fs.looked_up((SHM, 1), Lookup::Missing);
        assert!(!fs.contains((SHM, 1)));
        for ino in 100..(100 + MAX_FILES as u64 + 5) {
            seen(&mut fs, ino, 4096, 9);
        }
        fs.opened(9, 3, (SHM, 100), true);
        fs.trim();
        assert_eq!(fs.len(), MAX_FILES);
        assert!(fs.contains((SHM, 100)), "a held file stays");
        assert!(fs.dropped() >= 5);
    }

    #[test]
    fn a_rescan_finds_fds_that_came_without_an_open() {
        let mut fs = Files::default();
        let entry = |fd, dev, ino| FdEntry {
            fd,
            stat: FileStat {
                dev,
                ino,
                size: 0,
                allocated: 0,
                nlink: 1,
                regular: true,
            },
            name: Some("torch_1".into()),
        };
        fs.rescanned(
            20,
            vec![entry(7, SHM, 5), entry(8, Dev(8 << 20 | 1), 9)],
            |d| d == SHM,
        );
        assert_eq!(fs.get((SHM, 5)).unwrap().fd_holders, [20].into());
        assert!(!fs.contains((Dev(8 << 20 | 1), 9)), "ext4 is not tracked");
        // The fd is gone at the next rescan.
        fs.rescanned(20, vec![], |d| d == SHM);
        assert!(fs.get((SHM, 5)).unwrap().fd_holders.is_empty());
    }
}
