//! A process's memory cgroup: /dev/shm pages are charged to the memory
//! cgroup of the process that allocated them, so a pod's /dev/shm use counts
//! against its memory limit (an OOM kill, not ENOSPC, when the limit is
//! lower than the mount).

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::escape;

/// A memory cgroup as it stood when read (at a failure).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Memcg {
    /// The cgroup's path in its hierarchy (escaped).
    pub path: String,
    /// 1 or 2.
    pub version: u8,
    /// Bytes; None when unlimited.
    pub limit_bytes: Option<u64>,
    /// Its usage at the read (memory.current, or memory.usage_in_bytes on v1).
    pub usage_bytes: u64,
    /// Of the usage, shmem/tmpfs pages (memory.stat `shmem`).
    pub shmem_bytes: Option<u64>,
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

/// Reads memory cgroup `path` of hierarchy `version` under `root`.
pub fn read_at(root: &Path, version: u8, path: &str) -> Option<Memcg> {
    let rel = path.trim_start_matches('/');
    // The kernel writes these paths; ".." cannot appear in a cgroup name.
    if rel.split('/').any(|c| c == "..") {
        return None;
    }
    let dir: PathBuf = match version {
        1 => root.join("sys/fs/cgroup/memory").join(rel),
        _ => ["sys/fs/cgroup/unified", "sys/fs/cgroup"]
            .iter()
            .map(|b| root.join(b))
            .find(|b| b.join("cgroup.controllers").exists())?
            .join(rel),
    };
    let num = |name: &str| -> Option<u64> {
        std::fs::read_to_string(dir.join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
    let shmem = stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == "shmem").then(|| v.trim().parse().ok()).flatten()
    });
    let (limit, usage) = match version {
        1 => (
            num("memory.limit_in_bytes").filter(|&l| l < V1_UNLIMITED),
            num("memory.usage_in_bytes")?,
        ),
        _ => (num("memory.max"), num("memory.current")?),
    };
    Some(Memcg {
        path: escape::str(path),
        version,
        limit_bytes: limit,
        usage_bytes: usage,
        shmem_bytes: shmem,
    })
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
}
