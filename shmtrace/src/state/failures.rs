//! The failures: shared-memory failures in the order the kernel saw them,
//! SIGBUS that were not, and each mount as it stood at its first failure.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::{
    event::{Addr, CudaCall, Dev, Syscall},
    state::{
        causes::{Cause, Limit, Reason},
        containers::Container,
        procs::Ancestor,
    },
};

/// What failed, by family: the errno of a failed call, a SIGBUS on a tmpfs
/// page, an mmap/mremap refused, an OOM kill, a CUDA IPC error. JSON
/// `kind`, in snake case.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FailureKind {
    #[default]
    Sigbus,
    Enospc,
    Edquot,
    Efbig,
    Enomem,
    Emfile,
    Enfile,
    Enoent,
    /// Another errno.
    Error,
    MmapError,
    MremapError,
    OomKill,
    CudaIpc,
}

impl FailureKind {
    /// Every kind, in declaration order (the report schema's values).
    pub const ALL: [Self; 13] = [
        Self::Sigbus,
        Self::Enospc,
        Self::Edquot,
        Self::Efbig,
        Self::Enomem,
        Self::Emfile,
        Self::Enfile,
        Self::Enoent,
        Self::Error,
        Self::MmapError,
        Self::MremapError,
        Self::OomKill,
        Self::CudaIpc,
    ];

    /// The JSON name: "sigbus", "enospc", "mmap_error", "oom_kill"...
    pub fn name(self) -> &'static str {
        match self {
            Self::Sigbus => "sigbus",
            Self::Enospc => "enospc",
            Self::Edquot => "edquot",
            Self::Efbig => "efbig",
            Self::Enomem => "enomem",
            Self::Emfile => "emfile",
            Self::Enfile => "enfile",
            Self::Enoent => "enoent",
            Self::Error => "error",
            Self::MmapError => "mmap_error",
            Self::MremapError => "mremap_error",
            Self::OomKill => "oom_kill",
            Self::CudaIpc => "cuda_ipc",
        }
    }

    /// The kind of a call that failed with `errno` (mmap and mremap are
    /// told apart by the caller).
    pub fn of_errno(errno: i32) -> Self {
        match errno {
            libc::ENOSPC => Self::Enospc,
            libc::EDQUOT => Self::Edquot,
            libc::EFBIG => Self::Efbig,
            libc::ENOMEM => Self::Enomem,
            libc::EMFILE => Self::Emfile,
            libc::ENFILE => Self::Enfile,
            libc::ENOENT => Self::Enoent,
            _ => Self::Error,
        }
    }
}

impl Serialize for FailureKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The call that failed: a syscall, or a CUDA IPC function (JSON
/// `syscall`, by name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Syscall(Syscall),
    Cuda(CudaCall),
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Self::Syscall(s) => s.name(),
            Self::Cuda(c) => c.name(),
        }
    }
}

impl Serialize for Op {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// Where a mount's use at a failure came from (JSON `source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum UsageSource {
    /// The superblock's counters, read in the kernel at the event.
    Kernel,
    /// Measured by user space right after it.
    Statfs,
    /// Unknown.
    None,
}

/// Why a SIGBUS was no shared-memory failure (JSON `reason` of
/// `other_sigbus`, in words).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotShm {
    /// A handler re-raising it (PyTorch's worker handler does).
    RaisedBySelf,
    /// kill -BUS from another process.
    SentByOther,
    NotTmpfsMapping,
    /// Beyond the end of a truncated tmpfs file.
    PastEnd,
}

impl NotShm {
    pub const ALL: [Self; 4] = [
        Self::RaisedBySelf,
        Self::SentByOther,
        Self::NotTmpfsMapping,
        Self::PastEnd,
    ];

    pub fn words(self) -> &'static str {
        match self {
            Self::RaisedBySelf => "raised by the process itself (a handler re-raising it)",
            Self::SentByOther => "sent by another process",
            Self::NotTmpfsMapping => "fault address is not in a tmpfs mapping",
            Self::PastEnd => "access beyond the end of a tmpfs file (truncated), not a full tmpfs",
        }
    }
}

impl Serialize for NotShm {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.words())
    }
}

/// A tmpfs mount as it stood when a failure happened.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct MountAtFailure {
    /// As the failing process sees it (a container's is `/dev/shm`).
    pub mountpoint: Option<String>,
    /// Where the host has it, when that differs.
    pub host_mountpoint: Option<String>,
    pub dev: Dev,
    /// The mount namespace it was seen from.
    pub mount_ns: u32,
    /// Its size (size= of the tmpfs).
    pub size_bytes: Option<u64>,
    /// Bytes in use at the failure.
    pub used_bytes: Option<u64>,
    /// Bytes free at the failure.
    pub free_bytes: Option<u64>,
    /// Its inode limit (nr_inodes).
    pub inodes: Option<u64>,
    /// Inodes in use at the failure.
    pub inodes_used: Option<u64>,
    pub source: UsageSource,
}

/// A file on a failing mount that no traced process was seen to make (it
/// was there before tracing began, or an untraced process made it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Stray {
    /// Escaped, under the mount.
    pub name: String,
    /// Its inode number.
    pub ino: u64,
    /// Allocated bytes.
    pub bytes: u64,
}

/// A tmpfs file whose pages a memory cgroup was charged for, at an OOM
/// kill in it: what filled the limit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct ChargedFile {
    /// As the victim sees it ("/dev/shm/big"), escaped; null when the
    /// kernel gave no name.
    pub path: Option<String>,
    pub dev: Dev,
    /// Its inode number.
    pub ino: u64,
    /// The mount it is on, as the victim sees it.
    pub mountpoint: Option<String>,
    /// Bytes of its pages the cgroup's processes allocated.
    pub bytes: u64,
    /// Removed already (PyTorch unlinks at once): its pages go when its
    /// last holder does.
    pub unlinked: bool,
    /// Its pages, and the cgroup's charge for them, stay after the victim
    /// is gone (a named file, or another process holds it): the next
    /// process of the pod runs into the same limit.
    pub outlives_victim: bool,
}

/// Files listed for an OOM kill, largest first.
pub const MAX_CHARGED: usize = 10;

#[derive(Clone, Debug, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Holder {
    /// The holding process.
    pub pid: u32,
    /// Its name.
    pub comm: String,
    /// Bytes of files on the mount it kept alive (by fd or mapping).
    pub held_bytes: u64,
    /// The part of `held_bytes` in files other processes held too (one
    /// segment mapped by several): counted in each of them.
    pub shared_bytes: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Failure {
    /// When it happened: kernel monotonic nanoseconds, stamped first thing in the hook.
    pub ts_ns: u64,
    /// Seconds since shmtrace started.
    pub time_s: f64,
    /// Nanoseconds after the first failure (0 for the first).
    pub delay_ns: u64,
    /// Another process of the same incident failed less than [`TIE_NS`] from
    /// this one: closer than the clock can order them across CPUs, so
    /// either may have been first. The gap, and that process (null when
    /// no other failure came that close).
    pub tie_ns: Option<u64>,
    /// The other process of that tie.
    pub tie_pid: Option<u32>,
    /// The failing process (host PID namespace).
    pub pid: u32,
    /// The pid as the process itself sees it (in its container's PID
    /// namespace: what the framework prints in the container's log).
    pub ns_pid: Option<u32>,
    /// The failing thread.
    pub tid: u32,
    /// Its parent.
    pub ppid: u32,
    /// Its name, escaped.
    pub comm: String,
    pub kind: FailureKind,
    pub syscall: Option<Op>,
    /// The errno of a failed call (null for a SIGBUS, OOM kill or CUDA error).
    pub errno: Option<i32>,
    pub errno_name: Option<crate::signals::ErrnoName>,
    /// The signal (7, SIGBUS) of a page fault.
    pub signal: Option<i32>,
    /// The SIGBUS si_code (2 BUS_ADRERR: no page could be allocated).
    pub si_code: Option<i32>,
    /// The si_code by name.
    pub si_code_name: Option<&'static str>,
    pub fault_addr: Option<Addr>,
    /// As the failing process sees it (`/dev/shm/...` in a container).
    pub path: Option<String>,
    /// The same file from the host, when that differs.
    pub host_path: Option<String>,
    pub dev: Option<Dev>,
    /// The file's inode number.
    pub ino: Option<u64>,
    /// The offset in the file of the page or write that failed.
    pub offset: Option<u64>,
    /// The bytes the failing call asked for (a write's length, fallocate's).
    pub bytes: Option<u64>,
    /// The file's size (st_size) at the failure.
    pub file_size: Option<i64>,
    /// Whether the file had been removed (PyTorch unlinks at once): `ls /dev/shm` cannot show it.
    pub unlinked: Option<bool>,
    /// Why it happened, as typed facts.
    #[serde(skip)]
    pub why: Cause,
    /// `why` in words: filled by `analysis::causes::word` where it is shown.
    pub cause: String,
    /// The cause by name: only tmpfs_full and tmpfs_inodes mean /dev/shm
    /// ran out; the others have fixes of their own.
    pub reason: Reason,
    /// The limit it ran into, with its value, when one did.
    pub limit: Option<Limit>,
    /// What to change, for causes a bigger /dev/shm does not fix (worded
    /// with `cause`).
    pub fix: Option<String>,
    /// Libraries the failing process mapped that tell who uses the memory
    /// (libtorch, libnccl, libcudart, libcuda, ray), read at the failure.
    pub libraries: Vec<&'static str>,
    /// For an open that found its segment gone: who removed it, and when.
    pub removed_by: Option<super::removals::Removal>,
    /// The failing process's memory cgroup at the failure: /dev/shm pages
    /// count against its limit.
    pub memcg: Option<crate::host::memcg::Memcg>,
    /// For an OOM kill: the tmpfs files the memory cgroup that holds the
    /// limit (the victim's, or its pod's) had allocated, largest first
    /// (at most [`MAX_CHARGED`]); `path` and `mount` are the largest's.
    pub charged_files: Vec<ChargedFile>,
    /// For an OOM kill: the kernel's own OOM line (/dev/kmsg), naming the
    /// memory cgroup whose limit fired; null where the log cannot be read.
    pub kernel_oom: Option<crate::host::kmsg::OomLine>,
    pub mount: Option<MountAtFailure>,
    /// Its parents up to the traced root (or pid 1).
    pub ancestry: Vec<Ancestor>,
    /// The failing process's mount namespace.
    pub mnt_ns: u32,
    /// Times the same access faulted again after a handler returned.
    pub refaults: u32,
    /// Times the same process failed the same way again (same kind,
    /// syscall, errno and mount), and when it last did.
    pub repeats: u64,
    /// When it last repeated.
    pub last_ts_ns: Option<u64>,
    /// The incident it belongs to (one per failing mount, node-wide).
    pub incident: u64,
    /// The failing process's container (runtime, id, pod), when it is in one.
    pub container: Option<Container>,
    /// For the first failure on a mount: who held its bytes at that moment,
    /// and the last events on that mount before it.
    pub holders: Vec<Holder>,
    /// The last events on the mount before it, as lines.
    pub events_before: Vec<String>,
    /// For the first failure on a mount: the largest files there that no
    /// traced process made, how many there were and their bytes.
    pub strays: Vec<Stray>,
    /// How many such files there were.
    pub stray_count: u64,
    /// Their bytes, all of them.
    pub stray_bytes: u64,
}

impl Failure {
    /// Whether the call that failed was `sc`.
    pub fn syscall_is(&self, sc: Syscall) -> bool {
        self.syscall == Some(Op::Syscall(sc))
    }

    /// A failure of `kind` by `pid` at `ts_ns`, every detail still unknown.
    pub fn new(kind: FailureKind, ts_ns: u64, pid: u32, tid: u32) -> Self {
        Self {
            ts_ns,
            pid,
            tid,
            kind,
            ..Default::default()
        }
    }
}

/// A SIGBUS that was not on a tmpfs mapping: kept, but not a shm failure.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct OtherSignal {
    /// When the first one came, kernel monotonic nanoseconds.
    pub ts_ns: u64,
    /// The process it was sent to.
    pub pid: u32,
    /// The thread it was sent to.
    pub tid: u32,
    /// Who sent it (the target itself for a fault or a re-raise).
    pub sender_pid: u32,
    /// Its si_code (0 SI_USER, negative for user-sent, positive for the kernel's).
    pub si_code: i32,
    /// The si_code by name (BUS_ADRERR, SI_USER, SI_TKILL...).
    pub si_code_name: &'static str,
    /// The first one's fault address.
    pub fault_addr: Addr,
    pub reason: NotShm,
    /// How many such signals came (same target, sender, si_code and
    /// reason), and when the last did.
    pub count: u64,
    /// When the last one came.
    pub last_ts_ns: u64,
}

/// Two failures of different processes closer than this cannot be ordered
/// with confidence: each is stamped when its hook runs, and the kernel's
/// path from the failed allocation to the hook (a page fault's unwinding,
/// a syscall's return) varies by hundreds of nanoseconds between CPUs.
pub const TIE_NS: u64 = 1_000;

/// Distinct failures kept; repeats of one only count.
pub const MAX_FAILURES: usize = 1000;
/// Distinct kinds of other SIGBUS kept.
pub const MAX_OTHER: usize = 256;

/// What makes two failures "the same failure again".
type FailureKey = (u64, u32, FailureKind, Option<Op>, Option<i32>, Option<Dev>);
type OtherKey = (u32, u32, i32, NotShm);

#[derive(Default)]
pub struct Failures {
    list: Vec<Failure>,
    index: HashMap<FailureKey, usize>,
    other: Vec<OtherSignal>,
    other_index: HashMap<OtherKey, usize>,
    /// Each mount any failure touched, as it stood at its first failure.
    touched: BTreeMap<Dev, MountAtFailure>,
    /// Distinct failures and other signals not kept (over the caps); their
    /// repeats are not counted either.
    dropped: u64,
    other_dropped: u64,
}

impl Failures {
    /// Mount `dev` as it stood at its first failure.
    pub fn at_first_failure(&self, dev: Dev) -> Option<&MountAtFailure> {
        self.touched.get(&dev)
    }

    /// Mounts any failure touched.
    pub fn touched_devs(&self) -> impl Iterator<Item = Dev> + '_ {
        self.touched.keys().copied()
    }

    /// Distinct failures, and kinds of other SIGBUS, let go over the caps.
    pub fn dropped(&self) -> (u64, u64) {
        (self.dropped, self.other_dropped)
    }

    /// Whether `dev` has had a failure yet.
    pub fn is_first_on(&self, dev: Dev) -> bool {
        !self.touched.contains_key(&dev)
    }

    /// Whether a failure like this one (same process, kind, syscall, errno
    /// and mount) is already listed: then it only counts, and the caller
    /// can skip gathering its evidence.
    pub fn repeated(&mut self, f: &Failure) -> bool {
        match self.index.get(&key(f)) {
            Some(&i) => {
                let first = &mut self.list[i];
                first.repeats += 1;
                first.last_ts_ns = Some(first.last_ts_ns.unwrap_or(0).max(f.ts_ns));
                true
            }
            None => false,
        }
    }

    pub fn recorded(&mut self, f: Failure) {
        if self.repeated(&f) {
            return;
        }
        if let (Some(m), Some(dev)) = (&f.mount, f.dev) {
            self.touched.entry(dev).or_insert_with(|| m.clone());
        }
        if self.list.len() >= MAX_FAILURES {
            self.dropped += 1;
            return;
        }
        self.index.insert(key(&f), self.list.len());
        self.list.push(f);
    }

    /// Pids any kept failure names (failing, parent, ancestors): the
    /// process tree keeps them after they exit.
    pub fn pids(&self) -> std::collections::BTreeSet<u32> {
        self.list
            .iter()
            .flat_map(|f| {
                [f.pid, f.ppid]
                    .into_iter()
                    .chain(f.ancestry.iter().map(|a| a.pid))
                    .chain(f.holders.iter().map(|h| h.pid))
            })
            .chain(self.other.iter().map(|o| o.pid))
            .collect()
    }

    /// A handler that returns (Rust's runtime installs one) makes the same
    /// access fault again: counted on the failure it repeats. Returns
    /// whether it was one.
    pub fn refaulted(&mut self, tid: u32, addr: Addr) -> bool {
        match self
            .list
            .iter_mut()
            .rev()
            .find(|f| f.kind == FailureKind::Sigbus && f.tid == tid && f.fault_addr == Some(addr))
        {
            Some(f) => {
                f.refaults += 1;
                true
            }
            None => false,
        }
    }

    /// A SIGBUS that was no shm failure; repeats only count.
    pub fn not_shm(&mut self, s: OtherSignal) {
        let k = (s.pid, s.sender_pid, s.si_code, s.reason);
        if let Some(&i) = self.other_index.get(&k) {
            let o = &mut self.other[i];
            o.count += 1;
            o.last_ts_ns = o.last_ts_ns.max(s.ts_ns);
        } else if self.other.len() >= MAX_OTHER {
            self.other_dropped += 1;
        } else {
            self.other_index.insert(k, self.other.len());
            self.other.push(s);
        }
    }

    pub fn other(&self) -> &[OtherSignal] {
        &self.other
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn all(&self) -> &[Failure] {
        &self.list
    }

    /// In kernel time order, each with its delay after the first and the
    /// nearest failure of another process of its incident less than
    /// [`TIE_NS`] away, if any.
    pub fn ordered(&self) -> Vec<Failure> {
        let mut v = self.list.clone();
        v.sort_by_key(|f| (f.ts_ns, f.pid));
        if let Some(first) = v.first().map(|f| f.ts_ns) {
            for f in &mut v {
                f.delay_ns = f.ts_ns - first;
            }
        }
        for i in 0..v.len() {
            let near = |j: usize| {
                let (a, b) = (&v[i], &v[j]);
                (a.incident == b.incident && a.pid != b.pid)
                    .then(|| (a.ts_ns.abs_diff(b.ts_ns), b.pid))
            };
            // Sorted by time: only neighbours within the window can tie.
            let before = (0..i)
                .rev()
                .take_while(|&j| v[i].ts_ns - v[j].ts_ns < TIE_NS)
                .filter_map(near);
            let after = (i + 1..v.len())
                .take_while(|&j| v[j].ts_ns - v[i].ts_ns < TIE_NS)
                .filter_map(near);
            if let Some((gap, pid)) = before.chain(after).min() {
                v[i].tie_ns = Some(gap);
                v[i].tie_pid = Some(pid);
            }
        }
        v
    }
}

fn key(f: &Failure) -> FailureKey {
    (f.incident, f.pid, f.kind, f.syscall, f.errno, f.dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(dev: u32, used: u64) -> MountAtFailure {
        MountAtFailure {
            mountpoint: Some("/dev/shm".into()),
            host_mountpoint: None,
            dev: Dev(dev),
            mount_ns: 1,
            size_bytes: Some(100),
            used_bytes: Some(used),
            free_bytes: Some(100 - used),
            inodes: None,
            inodes_used: None,
            source: UsageSource::Kernel,
        }
    }

    #[test]
    fn ordered_by_kernel_time_and_first_mount_state_kept() {
        let mut fs = Failures::default();
        let mut late = Failure::new(FailureKind::Sigbus, 300, 2, 2);
        late.dev = Some(Dev(40));
        late.mount = Some(at(40, 99));
        let mut early = Failure::new(FailureKind::Enospc, 100, 3, 3);
        early.dev = Some(Dev(40));
        early.mount = Some(at(40, 90));
        assert!(fs.is_first_on(Dev(40)));
        fs.recorded(late);
        fs.recorded(early);
        let v = fs.ordered();
        assert_eq!(v.iter().map(|f| f.pid).collect::<Vec<_>>(), vec![3, 2]);
        assert_eq!(v[1].delay_ns, 200);
        assert_eq!(
            fs.touched[&Dev(40)].used_bytes,
            Some(99),
            "the first recorded stays"
        );
    }

    #[test]
    fn failures_closer_than_the_clock_can_order_are_a_tie() {
        let mut fs = Failures::default();
        let f = |ts, pid, incident| {
            let mut f = Failure::new(FailureKind::Sigbus, ts, pid, pid);
            f.incident = incident;
            f
        };
        // Two workers 31 ns apart on one mount; a third 2 us later; a
        // process of another incident 10 ns after the first.
        fs.recorded(f(1_031, 12, 1));
        fs.recorded(f(1_000, 11, 1));
        fs.recorded(f(3_100, 13, 1));
        fs.recorded(f(1_010, 99, 2));
        let v = fs.ordered();
        let by = |pid| v.iter().find(|f| f.pid == pid).unwrap();
        assert_eq!(v[0].pid, 11, "still ordered by the clock");
        assert_eq!((by(11).tie_ns, by(11).tie_pid), (Some(31), Some(12)));
        assert_eq!((by(12).tie_ns, by(12).tie_pid), (Some(31), Some(11)));
        assert_eq!((by(13).tie_ns, by(13).tie_pid), (None, None));
        assert_eq!(by(99).tie_ns, None, "another incident's failure is no tie");
        // The same process twice is no tie either.
        let mut fs = Failures::default();
        let mut a = f(1_000, 11, 1);
        a.kind = FailureKind::Enospc;
        fs.recorded(a);
        fs.recorded(f(1_005, 11, 1));
        assert!(fs.ordered().iter().all(|f| f.tie_ns.is_none()));
    }

    #[test]
    fn repeats_count_on_the_first_and_lists_are_capped() {
        let mut fs = Failures::default();
        for i in 0..5u64 {
            let mut f = Failure::new(FailureKind::Enospc, 10 + i, 7, 7);
            f.syscall = Some(Op::Syscall(Syscall::Fallocate));
            f.errno = Some(28);
            f.dev = Some(Dev(40));
            fs.recorded(f);
        }
        assert_eq!(fs.len(), 1);
        assert_eq!((fs.all()[0].repeats, fs.all()[0].last_ts_ns), (4, Some(14)));
        for pid in 0..(MAX_FAILURES as u32 + 10) {
            fs.recorded(Failure::new(
                FailureKind::Sigbus,
                100,
                1000 + pid,
                1000 + pid,
            ));
        }
        assert_eq!((fs.len(), fs.dropped), (MAX_FAILURES, 11));
        let sig = |ts, sender, reason| OtherSignal {
            ts_ns: ts,
            pid: 9,
            tid: 9,
            sender_pid: sender,
            si_code: 0,
            si_code_name: "SI_USER",
            fault_addr: Addr(0),
            reason,
            count: 1,
            last_ts_ns: ts,
        };
        for ts in 0..100_000 {
            fs.not_shm(sig(ts, 9, NotShm::RaisedBySelf));
        }
        fs.not_shm(sig(5, 1, NotShm::SentByOther));
        assert_eq!(fs.other().len(), 2);
        assert_eq!(
            (fs.other()[0].count, fs.other()[0].last_ts_ns),
            (100_000, 99_999)
        );
        for sender in 0..(MAX_OTHER as u32 * 2) {
            fs.not_shm(sig(1, 100 + sender, NotShm::SentByOther));
        }
        assert_eq!(fs.other().len(), MAX_OTHER);
        assert!(fs.other_dropped > 0);
    }

    #[test]
    fn a_refault_is_counted_not_listed() {
        let mut fs = Failures::default();
        let mut f = Failure::new(FailureKind::Sigbus, 1, 5, 6);
        f.fault_addr = Some(Addr(0x1000));
        fs.recorded(f);
        assert!(fs.refaulted(6, Addr(0x1000)));
        assert!(!fs.refaulted(6, Addr(0x2000)));
        assert!(!fs.refaulted(7, Addr(0x1000)));
        assert_eq!((fs.len(), fs.all()[0].refaults), (1, 1));
    }

    #[test]
    fn kinds_come_from_errnos_and_serialize_by_name() {
        assert_eq!(FailureKind::of_errno(libc::ENOSPC), FailureKind::Enospc);
        assert_eq!(FailureKind::of_errno(libc::EMFILE), FailureKind::Emfile);
        assert_eq!(FailureKind::of_errno(libc::EIO), FailureKind::Error);
        for (k, name) in [
            (FailureKind::MmapError, "mmap_error"),
            (FailureKind::OomKill, "oom_kill"),
            (FailureKind::CudaIpc, "cuda_ipc"),
            (FailureKind::Edquot, "edquot"),
        ] {
            assert_eq!(serde_json::to_value(k).unwrap(), name);
            assert_eq!(k.to_string(), name);
        }
        assert_eq!(
            serde_json::to_value(Op::Cuda(CudaCall::GetMemHandle)).unwrap(),
            "cudaIpcGetMemHandle"
        );
        assert_eq!(serde_json::to_value(UsageSource::Statfs).unwrap(), "statfs");
        assert_eq!(
            serde_json::to_value(NotShm::SentByOther).unwrap(),
            "sent by another process"
        );
    }

    #[test]
    fn repeats_are_per_incident_kind_call_and_mount() {
        let mut fs = Failures::default();
        let f = |incident, kind, sc| {
            let mut f = Failure::new(kind, 10, 7, 7);
            f.incident = incident;
            f.syscall = sc;
            f.dev = Some(Dev(40));
            f
        };
        let fallocate = Some(Op::Syscall(Syscall::Fallocate));
        fs.recorded(f(1, FailureKind::Enospc, fallocate));
        fs.recorded(f(1, FailureKind::Enospc, fallocate));
        fs.recorded(f(1, FailureKind::Enospc, Some(Op::Syscall(Syscall::Write))));
        fs.recorded(f(2, FailureKind::Enospc, fallocate));
        fs.recorded(f(1, FailureKind::Sigbus, None));
        assert_eq!(fs.len(), 4);
        assert_eq!(fs.all()[0].repeats, 1);
        assert!(fs.pids().contains(&7));
    }

    #[test]
    fn only_a_sigbus_of_the_same_thread_and_address_is_a_refault() {
        let mut fs = Failures::default();
        let mut f = Failure::new(FailureKind::Enospc, 1, 5, 6);
        f.fault_addr = Some(Addr(0x1000));
        fs.recorded(f);
        assert!(!fs.refaulted(6, Addr(0x1000)), "an ENOSPC is no fault");
        let mut f = Failure::new(FailureKind::Sigbus, 2, 5, 6);
        f.fault_addr = Some(Addr(0x1000));
        fs.recorded(f);
        assert!(fs.refaulted(6, Addr(0x1000)));
        assert_eq!(fs.all()[1].refaults, 1);
    }
}
