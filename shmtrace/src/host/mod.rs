//! The one narrow interface between state and the machine: every read of
//! /proc, statfs, stat and cgroupfs, and the namespace anchors, goes
//! through [`Host`]. `ProcHost` is the real one; unit tests use a fixture
//! host that touches nothing.

pub mod anchors;
pub mod blocking;
pub mod cgroup;
#[cfg(test)]
pub mod fixture;
pub mod kmsg;
pub mod listing;
pub mod memcg;
pub mod mountinfo;
pub mod proc;
pub mod procfs;
pub mod runtimes;

pub use proc::ProcHost;

use self::{
    cgroup::{Container, Names},
    mountinfo::{Mount, Usage},
};
use crate::event::{Addr, Dev};

/// What stat(2) says of a file, the parts state needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStat {
    pub dev: Dev,
    pub ino: u64,
    pub size: i64,
    /// st_blocks * 512.
    pub allocated: u64,
    pub nlink: u64,
    pub regular: bool,
}

/// A process's limits and use, read at a failure to tell its cause.
/// None: unlimited or unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Soft RLIMIT_AS, RLIMIT_FSIZE and RLIMIT_NOFILE.
    pub address_space: Option<u64>,
    pub file_size: Option<u64>,
    pub open_files: Option<u64>,
    /// VmSize, mappings, and open fds now.
    pub vm_bytes: Option<u64>,
    pub map_count: Option<u64>,
    pub fds_open: Option<u64>,
    /// vm.max_map_count.
    pub max_map_count: Option<u64>,
    /// Its memory cgroup's limit and use (v2 memory.max/current, v1
    /// memory.limit_in_bytes/usage_in_bytes).
    pub memcg_limit: Option<u64>,
    pub memcg_usage: Option<u64>,
}

/// A file looked up by name on a tmpfs mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Found(FileStat),
    /// The mount answered: no such name.
    Missing,
    /// Could not tell (no way into the namespace, the mount moved).
    Unknown,
}

/// One open fd of a process on a tmpfs-or-other file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdEntry {
    pub fd: i32,
    pub stat: FileStat,
    /// The file's last path component (escaped), as /proc/PID/fd shows it.
    pub name: Option<String>,
}

/// One file mapping of a process, from /proc/PID/maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsEntry {
    pub start: Addr,
    pub end: Addr,
    pub file_offset: u64,
    pub dev: Dev,
    pub ino: u64,
    /// Last path component (escaped).
    pub name: Option<String>,
}

pub trait Host {
    /// Now, on a monotonic clock: state's only source of time beyond the
    /// kernel's event stamps (a fixture sets it).
    fn now(&self) -> std::time::Instant {
        std::time::Instant::now()
    }
    /// shmtrace's own pid and mount namespace.
    fn self_pid(&self) -> u32;
    fn self_ns(&self) -> u32;
    /// (ppid, comm) of a live process.
    fn proc_stat(&self, pid: u32) -> Option<(u32, String)>;
    /// Whether `pid` has exited: gone, a zombie, or exiting (whose fds and
    /// maps list empty, though its exit event may not be applied yet).
    fn has_exited(&self, pid: u32) -> bool;
    /// Its command line, escaped, arguments joined by spaces.
    fn cmdline(&self, pid: u32) -> Option<String>;
    fn mnt_ns(&self, pid: u32) -> Option<u32>;
    /// The mount table of namespace `ns`, read through its anchor (made
    /// now through `via`, a process inside it, if there is none yet).
    fn mountinfo(&mut self, ns: u32, via: u32) -> Option<Vec<Mount>>;
    /// The namespaces anchored so far.
    fn anchored(&self) -> Vec<u32>;
    fn anchor_of(&self, ns: u32) -> Option<u32>;
    /// Lets namespace `ns` go (its anchor exits).
    fn release(&mut self, ns: u32);
    /// statfs of `mountpoint` as seen in namespace `ns`, through its anchor
    /// or one of `via`, and only if that path really is device `dev` there.
    fn statfs(&self, dev: Dev, ns: u32, mountpoint: &str, via: &[u32]) -> Option<Usage>;
    /// File mappings of `pid`.
    /// lstat of `rel` (no symlink followed) under mount `dev` at
    /// `mountpoint` in namespace `ns`.
    fn lookup(&self, dev: Dev, ns: u32, mountpoint: &str, rel: &str) -> Lookup;
    /// The regular files at the top of mount `dev` (at `mountpoint` in
    /// namespace `ns`), escaped names with their stat, and how many
    /// entries were not read (past a cap).
    fn list(
        &self,
        _dev: Dev,
        _ns: u32,
        _mountpoint: &str,
    ) -> Option<(Vec<(String, FileStat)>, u64)> {
        None
    }
    fn maps(&self, pid: u32) -> Vec<MapsEntry>;
    /// Limits of `pid` now (at a failure).
    fn limits(&self, pid: u32) -> Limits;
    /// Open fds of `pid` on regular files (None: the process has exited).
    fn fds(&self, pid: u32) -> Option<Vec<FdEntry>>;
    fn stat_fd(&self, pid: u32, fd: i32) -> Option<FileStat>;
    /// stat of file (dev, ino) through one of `pid`'s mappings of it.
    fn stat_mapped(&self, pid: u32, dev: Dev, ino: u64) -> Option<FileStat>;
    /// stat of the file behind the mapping [start, end) of `pid`.
    fn stat_map_range(&self, pid: u32, start: Addr, end: Addr) -> Option<FileStat>;
    /// Where `pid`'s fd `dirfd` (None: its working directory) points.
    fn dir_of(&self, pid: u32, dirfd: Option<i32>) -> Option<String>;
    /// The cgroup path that names `pid`'s container.
    fn cgroup(&self, pid: u32) -> Option<String>;
    /// The cgroup v2 path of cgroup id `id` (a walk of the hierarchy, at
    /// most once a second on a miss).
    fn cgroup_path(&mut self, id: u64) -> Option<String>;
    /// `pid` as the process sees it (its PID namespace's number).
    fn ns_pid(&self, _pid: u32) -> Option<u32> {
        None
    }
    /// The memory cgroup `pid` is in now: (hierarchy version, path).
    fn memcg_of(&self, _pid: u32) -> Option<(u8, String)> {
        None
    }
    /// The memory cgroup the kernel named by id in an event
    /// (`Header::memcg_id`): (hierarchy version, raw path). A walk of the
    /// hierarchy, at most once a second on a miss (`memcg::IdCache`).
    fn memcg_path(&mut self, _id: u64) -> Option<(u8, String)> {
        None
    }
    /// A memory cgroup's limit, usage and shmem now (at a failure).
    fn memcg_at(&self, _version: u8, _path: &str) -> Option<memcg::Memcg> {
        None
    }
    /// The kernel's own OOM line about `pid` (/dev/kmsg), when it can be
    /// read: the memory cgroup whose limit fired.
    fn kernel_oom(&mut self, _pid: u32) -> Option<kmsg::OomLine> {
        None
    }
    /// A container's and pod's names (kubelet's logs, the runtime's state).
    fn container_names(&self, _c: &Container) -> Option<Names> {
        None
    }
    /// Reads that stalled (timed out) or were skipped for it.
    fn stalls(&self) -> blocking::Stalls {
        blocking::Stalls::default()
    }
}
