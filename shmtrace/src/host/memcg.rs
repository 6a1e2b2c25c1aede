//! A process's memory cgroup: /dev/shm pages are charged to the memory
//! cgroup of the process that allocated them, so a pod's /dev/shm use counts
//! against its memory limit (an OOM kill, not ENOSPC, when the limit is
//! lower than the mount).

use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::Instant,
};

use serde::Serialize;

use crate::escape;

/// A memory cgroup as it stood when read (at a failure), with the limit
/// that applies to it: the tightest on the path to the root. In Kubernetes
/// a container without a limit of its own is bounded by its pod's cgroup,
/// and on cgroup v2 nodes the pod slice often holds the only one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Memcg {
    /// The cgroup's path in its hierarchy (escaped).
    pub path: String,
    /// 1 or 2.
    pub version: u8,
    /// The limit that applies, in bytes: the tightest memory.max (v1
    /// memory.limit_in_bytes) from this cgroup up to the root; null when
    /// there is none on the whole path.
    pub limit_bytes: Option<u64>,
    /// The cgroup that holds that limit: this one, or an ancestor (the
    /// pod's) (escaped).
    pub limit_path: Option<String>,
    /// This cgroup's own limit, null when it has none.
    pub own_limit_bytes: Option<u64>,
    /// Usage of the cgroup that holds the limit (this one's when there is
    /// none): memory.current, or memory.usage_in_bytes on v1.
    pub usage_bytes: u64,
    /// Of that usage, shmem/tmpfs pages (memory.stat `shmem`; v1
    /// `total_shmem`, which counts the cgroups below).
    pub shmem_bytes: Option<u64>,
    /// Of that usage, page cache with shmem in it (memory.stat `file`; v1
    /// `total_cache`).
    pub file_bytes: Option<u64>,
    /// v2: the tightest memory.high on the path (a throttle, not a kill),
    /// null when none.
    pub high_bytes: Option<u64>,
    /// v2 memory.events of the cgroup that holds the limit: OOM kills in it
    /// (its cgroups below included) so far, which confirms its limit fired.
    pub oom_kills: Option<u64>,
    /// v2 memory.events `max`: times its usage hit the limit.
    pub max_events: Option<u64>,
    /// `limit_path` as the kernel writes it (not escaped), to match the
    /// cgroups of other processes against it.
    #[serde(skip)]
    pub limit_raw: Option<String>,
}

impl Memcg {
    /// Whether the limit that applies is an ancestor's (a pod's), not the
    /// cgroup's own.
    pub fn limited_above(&self) -> bool {
        self.limit_bytes.is_some() && self.own_limit_bytes != self.limit_bytes
    }

    /// The cgroup whose usage and limit matter: the one holding the limit,
    /// else this one (escaped).
    pub fn limiting(&self) -> &str {
        self.limit_path.as_deref().unwrap_or(&self.path)
    }

    /// Whether cgroup `path` (raw) is at or below the one holding the
    /// limit: its pages count against that limit.
    pub fn covers(&self, path: &str) -> bool {
        let top = self.limit_raw.as_deref().unwrap_or("/");
        top == "/" || path == top || path.starts_with(&format!("{top}/"))
    }
}

/// v1 hierarchies report "no limit" as a page-rounded LONG_MAX.
const V1_UNLIMITED: u64 = 1 << 62;

/// Where the memory controller of `/proc/PID/cgroup` lives: (version,
/// path). v1's memory line wins (a hybrid host runs it there).
pub fn memory_line(text: &str) -> Option<(u8, String)> {
    let mut v2 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            return Some((1, path.to_string()));
        }
        if controllers.is_empty() {
            v2 = Some((2, path.to_string()));
        }
    }
    v2
}

/// The memory cgroup `pid` is in: (version, raw path). A process that has
/// exited shows the root ("/") until reaped, so callers keep what they read
/// while it lived.
pub fn locate(root: &Path, pid: u32) -> Option<(u8, String)> {
    let text = std::fs::read_to_string(root.join(format!("proc/{pid}/cgroup"))).ok()?;
    memory_line(&text)
}

/// Reads the memory cgroup of `pid` under `root` ("/" on a real host).
pub fn read(root: &Path, pid: u32) -> Option<Memcg> {
    let (version, path) = locate(root, pid)?;
    read_at(root, version, &path)
}

/// Where hierarchy `version` is mounted under `root`.
fn base(root: &Path, version: u8) -> Option<PathBuf> {
    match version {
        1 => Some(root.join("sys/fs/cgroup/memory")),
        _ => ["sys/fs/cgroup/unified", "sys/fs/cgroup"]
            .iter()
            .map(|b| root.join(b))
            .find(|b| b.join("cgroup.controllers").exists()),
    }
}

/// The hierarchy the memory controller is on: v1 where it is mounted
/// (a hybrid host), else v2.
fn memory_version(root: &Path) -> u8 {
    let v1 = root.join("sys/fs/cgroup/memory/memory.limit_in_bytes");
    if v1.exists() { 1 } else { 2 }
}

/// Every memory cgroup by the id the kernel gives it (its directory's
/// inode number, `Event::memcg_id`): id -> (version, raw path). One walk
/// of the hierarchy memory is on, bounded like the v2 walk.
pub fn ids(root: &Path) -> HashMap<u64, (u8, String)> {
    let version = memory_version(root);
    let Some(base) = base(root, version) else {
        return HashMap::new();
    };
    let mut paths = HashMap::new();
    if let Ok(md) = std::fs::metadata(&base) {
        paths.insert(md.ino(), "/".to_string());
    }
    // Raw, as /proc/PID/cgroup writes them: `read_at` takes these paths.
    let raw = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    super::procfs::walk(&base, &base, &mut paths, 0, &raw);
    paths
        .into_iter()
        .map(|(id, p)| (id, (version, p)))
        .collect()
}

/// Memory cgroup ids resolved to paths, from the last walk. A miss walks
/// again, at most once a second; an id missing from a walk that began
/// after it was asked for is gone (ids are never reused) and walks no more.
#[derive(Default)]
pub struct IdCache {
    ids: HashMap<u64, (u8, String)>,
    last_walk: Option<Instant>,
    gone: HashSet<u64>,
}

/// Gone ids remembered at most (then forgotten together: one more walk).
const MAX_GONE: usize = 4096;

impl IdCache {
    /// `id`'s (version, raw path); `walk` is called on a miss when the last
    /// walk is a second old (None: it did not finish).
    pub fn lookup(
        &mut self,
        id: u64,
        now: Instant,
        walk: impl FnOnce() -> Option<HashMap<u64, (u8, String)>>,
    ) -> Option<(u8, String)> {
        if id == 0 || self.gone.contains(&id) {
            return None;
        }
        if !self.ids.contains_key(&id)
            && self
                .last_walk
                .is_none_or(|t| now.duration_since(t).as_secs() >= 1)
        {
            self.last_walk = Some(now);
            if let Some(ids) = walk() {
                // Rebuilt: removed cgroups leave it.
                self.ids = ids;
                if !self.ids.contains_key(&id) {
                    if self.gone.len() >= MAX_GONE {
                        self.gone.clear();
                    }
                    self.gone.insert(id);
                }
            }
        }
        self.ids.get(&id).cloned()
    }
}

/// Reads memory cgroup `path` of hierarchy `version` under `root`, and its
/// ancestors' limits up to the root: the tightest is the one that applies.
pub fn read_at(root: &Path, version: u8, path: &str) -> Option<Memcg> {
    let rel = path.trim_start_matches('/');
    // The kernel writes these paths; ".." cannot appear in a cgroup name.
    if rel.split('/').any(|c| c == "..") {
        return None;
    }
    let base = base(root, version)?;
    let (limit_file, usage_file) = match version {
        1 => ("memory.limit_in_bytes", "memory.usage_in_bytes"),
        _ => ("memory.max", "memory.current"),
    };
    let own_dir = base.join(rel);
    let usage_own = num(&own_dir, usage_file)?;
    // This cgroup and each ancestor below the root, nearest first ("max",
    // a missing file or v1's LONG_MAX read as no limit).
    let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
    let mut limit: Option<(u64, String)> = None;
    let mut high: Option<u64> = None;
    let mut own_limit = None;
    for depth in (1..=parts.len()).rev() {
        let raw = format!("/{}", parts[..depth].join("/"));
        let dir = base.join(&raw[1..]);
        let l = num(&dir, limit_file).filter(|&l| l < V1_UNLIMITED);
        if depth == parts.len() {
            own_limit = l;
        }
        if let Some(l) = l
            && limit.as_ref().is_none_or(|(best, _)| l < *best)
        {
            limit = Some((l, raw.clone()));
        }
        if version == 2
            && let Some(h) = num(&dir, "memory.high")
        {
            high = Some(high.map_or(h, |x| x.min(h)));
        }
    }
    // Usage, shmem and events of the cgroup that holds the limit.
    let at = match &limit {
        Some((_, raw)) => base.join(&raw[1..]),
        None => own_dir.clone(),
    };
    let usage = if limit.is_some() {
        num(&at, usage_file).unwrap_or(usage_own)
    } else {
        usage_own
    };
    let stat = read_keys(&at.join("memory.stat"));
    let (shmem_key, file_key) = match version {
        1 => ("total_shmem", "total_cache"),
        _ => ("shmem", "file"),
    };
    let stat_of = |k: &str, fallback: &str| stat.get(k).or_else(|| stat.get(fallback)).copied();
    let events = (version == 2).then(|| read_keys(&at.join("memory.events")));
    Some(Memcg {
        path: escape::str(path),
        version,
        limit_bytes: limit.as_ref().map(|(l, _)| *l),
        limit_path: limit.as_ref().map(|(_, p)| escape::str(p)),
        own_limit_bytes: own_limit,
        usage_bytes: usage,
        shmem_bytes: stat_of(shmem_key, "shmem"),
        file_bytes: stat_of(file_key, "cache"),
        high_bytes: high,
        oom_kills: events.as_ref().and_then(|e| e.get("oom_kill").copied()),
        max_events: events.as_ref().and_then(|e| e.get("max").copied()),
        limit_raw: limit.map(|(_, p)| p),
    })
}

/// A cgroup file holding one number ("max" and unreadable: None).
fn num(dir: &Path, name: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join(name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A flat-keyed cgroup file ("key value" lines: memory.stat,
/// memory.events).
fn read_keys(path: &Path) -> std::collections::BTreeMap<String, u64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_memory_controller_v1_first() {
        let hybrid = "12:memory:/kubepods/pod1/abc\n11:cpu,cpuacct:/x\n0::/unified/y\n";
        assert_eq!(memory_line(hybrid), Some((1, "/kubepods/pod1/abc".into())));
        assert_eq!(
            memory_line("0::/system.slice/a.scope\n"),
            Some((2, "/system.slice/a.scope".into()))
        );
        assert_eq!(memory_line("3:cpu:/a\n"), None);
    }

    #[test]
    fn reads_v1_and_v2_files_from_a_tree() {
        let root = std::env::temp_dir().join(format!("shmtrace-memcg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let v1 = root.join("sys/fs/cgroup/memory/job");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::create_dir_all(root.join("proc/7")).unwrap();
        std::fs::write(root.join("proc/7/cgroup"), "5:memory:/job\n0::/\n").unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "50331648\n").unwrap();
        std::fs::write(v1.join("memory.usage_in_bytes"), "50000000\n").unwrap();
        std::fs::write(
            v1.join("memory.stat"),
            "cache 1\nshmem 41943040\ntotal_shmem 41943040\n",
        )
        .unwrap();
        let m = read(&root, 7).unwrap();
        assert_eq!(
            (m.version, m.limit_bytes, m.usage_bytes, m.shmem_bytes),
            (1, Some(48 << 20), 50_000_000, Some(40 << 20))
        );
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(read(&root, 7).unwrap().limit_bytes, None, "unlimited");

        let v2 = root.join("sys/fs/cgroup/pod");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(root.join("sys/fs/cgroup/cgroup.controllers"), "memory\n").unwrap();
        std::fs::write(root.join("proc/7/cgroup"), "0::/pod\n").unwrap();
        std::fs::write(v2.join("memory.max"), "max\n").unwrap();
        std::fs::write(v2.join("memory.current"), "123\n").unwrap();
        std::fs::write(v2.join("memory.stat"), "anon 1\nshmem 100\n").unwrap();
        let m = read(&root, 7).unwrap();
        assert_eq!(
            (m.version, m.limit_bytes, m.usage_bytes, m.shmem_bytes),
            (2, None, 123, Some(100))
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Kubernetes' systemd-driver shape on cgroup v2: the limit on the pod
    /// slice, none on the container's scope.
    #[test]
    fn the_tightest_limit_up_the_path_applies_v2() {
        let root = std::env::temp_dir().join(format!("shmtrace-memcg2-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let pod = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b_3c4d.slice";
        let scope = format!("{pod}/cri-containerd-{}.scope", "a".repeat(64));
        let base = root.join("sys/fs/cgroup");
        std::fs::create_dir_all(base.join(&scope)).unwrap();
        std::fs::write(base.join("cgroup.controllers"), "memory pids\n").unwrap();
        let put = |dir: &str, name: &str, v: &str| {
            std::fs::write(base.join(dir).join(name), format!("{v}\n")).unwrap()
        };
        put("kubepods.slice", "memory.max", "8589934592");
        put(
            "kubepods.slice/kubepods-burstable.slice",
            "memory.max",
            "max",
        );
        put(pod, "memory.max", "50331648");
        put(pod, "memory.high", "max");
        put(pod, "memory.current", "50200000");
        put(
            pod,
            "memory.stat",
            "anon 1000\nfile 49000000\nshmem 48955392",
        );
        put(
            pod,
            "memory.events",
            "low 0\nhigh 0\nmax 212\noom 1\noom_kill 1\noom_group_kill 1",
        );
        put(&scope, "memory.max", "max");
        put(&scope, "memory.high", "max");
        put(&scope, "memory.current", "49000000");
        put(&scope, "memory.stat", "shmem 48000000");
        let m = read_at(&root, 2, &format!("/{scope}")).unwrap();
        assert_eq!(m.limit_bytes, Some(48 << 20));
        assert_eq!(m.limit_path.as_deref(), Some(&*format!("/{pod}")));
        assert_eq!(m.own_limit_bytes, None);
        assert!(m.limited_above());
        assert_eq!(
            (m.usage_bytes, m.shmem_bytes, m.file_bytes),
            (50_200_000, Some(48_955_392), Some(49_000_000)),
            "the pod's usage, not the container's"
        );
        assert_eq!(
            (m.oom_kills, m.max_events, m.high_bytes),
            (Some(1), Some(212), None)
        );
        assert!(m.covers(&format!("/{pod}/cri-containerd-{}.scope", "b".repeat(64))));
        assert!(!m.covers("/kubepods.slice/kubepods-besteffort.slice"));
        // With a tighter limit of its own, that one applies.
        put(&scope, "memory.max", "16777216");
        let m = read_at(&root, 2, &format!("/{scope}")).unwrap();
        assert_eq!(
            (m.limit_bytes, m.own_limit_bytes),
            (Some(16 << 20), Some(16 << 20))
        );
        assert_eq!(m.usage_bytes, 49_000_000);
        assert!(!m.limited_above());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_parents_limit_applies_v1() {
        let root = std::env::temp_dir().join(format!("shmtrace-memcg1-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let base = root.join("sys/fs/cgroup/memory");
        std::fs::create_dir_all(base.join("job/worker")).unwrap();
        std::fs::write(base.join("job/memory.limit_in_bytes"), "50331648\n").unwrap();
        std::fs::write(base.join("job/memory.usage_in_bytes"), "50000000\n").unwrap();
        std::fs::write(
            base.join("job/memory.stat"),
            "cache 0\nshmem 0\ntotal_cache 49000000\ntotal_shmem 48000000\n",
        )
        .unwrap();
        std::fs::write(
            base.join("job/worker/memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        std::fs::write(base.join("job/worker/memory.usage_in_bytes"), "49000000\n").unwrap();
        let m = read_at(&root, 1, "/job/worker").unwrap();
        assert_eq!(
            (m.limit_bytes, m.limit_path.as_deref(), m.own_limit_bytes),
            (Some(48 << 20), Some("/job"), None)
        );
        assert_eq!(
            (m.usage_bytes, m.shmem_bytes, m.file_bytes),
            (50_000_000, Some(48_000_000), Some(49_000_000))
        );
        assert_eq!(m.oom_kills, None, "no memory.events on v1");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn ids_are_the_inodes_of_the_hierarchy_memory_is_on() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("sys/fs/cgroup/memory");
        std::fs::create_dir_all(base.join("kubepods/pod1")).unwrap();
        std::fs::write(base.join("memory.limit_in_bytes"), "1\n").unwrap();
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        let found = ids(root.path());
        assert_eq!(found.get(&ino(&base)), Some(&(1, "/".to_string())));
        assert_eq!(
            found.get(&ino(&base.join("kubepods/pod1"))),
            Some(&(1, "/kubepods/pod1".to_string()))
        );
        // No v1 memory controller: the v2 hierarchy.
        let v2 = tempfile::tempdir().unwrap();
        let cg = v2.path().join("sys/fs/cgroup");
        std::fs::create_dir_all(cg.join("kubepods.slice")).unwrap();
        std::fs::write(cg.join("cgroup.controllers"), "memory\n").unwrap();
        assert_eq!(
            ids(v2.path()).get(&ino(&cg.join("kubepods.slice"))),
            Some(&(2, "/kubepods.slice".to_string()))
        );
    }

    #[test]
    fn an_id_cache_walks_at_most_once_a_second_and_gives_up_on_gone_ids() {
        let mut c = IdCache::default();
        let t0 = Instant::now();
        let walks = std::cell::Cell::new(0);
        let tree = |with: &[u64]| {
            walks.set(walks.get() + 1);
            Some(with.iter().map(|&i| (i, (1, format!("/c{i}")))).collect())
        };
        assert_eq!(c.lookup(5, t0, || tree(&[5])), Some((1, "/c5".into())));
        // A new id within the second: no walk yet.
        let soon = t0 + std::time::Duration::from_millis(300);
        assert_eq!(c.lookup(6, soon, || tree(&[5, 6])), None);
        let later = t0 + std::time::Duration::from_secs(2);
        assert_eq!(
            c.lookup(6, later, || tree(&[5, 6])),
            Some((1, "/c6".into()))
        );
        assert_eq!(walks.get(), 2);
        // Not in a walk that began after it was asked for: gone for good.
        let after = later + std::time::Duration::from_secs(2);
        assert_eq!(c.lookup(7, after, || tree(&[5, 6])), None);
        let much_later = after + std::time::Duration::from_secs(9);
        assert_eq!(c.lookup(7, much_later, || tree(&[5, 6, 7])), None);
        assert_eq!(walks.get(), 3, "a gone id walks no more");
        assert_eq!(c.lookup(0, much_later, || tree(&[0])), None);
    }
}
