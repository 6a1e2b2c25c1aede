//! The traced process tree, as fork/exec/exit events and event headers tell
//! it, and each process's tmpfs mappings (to turn a SIGBUS address into a
//! file and an offset).

use std::collections::HashMap;

use serde::Serialize;

use crate::escape;

#[derive(Clone, Debug, Serialize)]
pub struct Proc {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    /// Command line at its last exec (or when first seen), escaped.
    pub cmdline: Option<String>,
    pub mnt_ns: u32,
    pub cgroup_id: u64,
    /// A process shmtrace was asked to trace (the `run` command, `--pid`).
    pub root: bool,
    pub first_seen_ns: u64,
    pub exit_ts_ns: Option<u64>,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    /// How SIGBUS was last handled on delivery: "default" (fatal) or a handler.
    pub sigbus_handler: Option<String>,
    /// A SIGBUS handler of its own ran at least once.
    pub sigbus_handler_ran: bool,
    /// It raised SIGBUS again itself (PyTorch's worker handler does).
    pub sigbus_reraised: bool,
    /// Bytes of tmpfs pages it allocated that are still live.
    pub allocated_bytes: u64,
    /// Bytes of tmpfs files it keeps alive by an fd or a mapping (a file
    /// shared by several processes counts for each).
    pub held_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub peak_held_bytes: u64,
    pub container: Option<crate::containers::Container>,
}

impl Proc {
    pub fn new(pid: u32, ppid: u32, ts: u64) -> Self {
        Self {
            pid,
            ppid,
            comm: String::new(),
            cmdline: None,
            mnt_ns: 0,
            cgroup_id: 0,
            root: false,
            first_seen_ns: ts,
            exit_ts_ns: None,
            exit_code: None,
            exit_signal: None,
            sigbus_handler: None,
            sigbus_handler_ran: false,
            sigbus_reraised: false,
            allocated_bytes: 0,
            held_bytes: 0,
            peak_allocated_bytes: 0,
            peak_held_bytes: 0,
            container: None,
        }
    }

    pub fn alive(&self) -> bool {
        self.exit_ts_ns.is_none()
    }
}

/// Reads /proc/PID/cmdline, escaped, arguments joined by spaces.
pub fn read_cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    if raw.is_empty() {
        return None;
    }
    let parts: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let s = escape::bytes(p);
            if s.contains(' ') { format!("'{s}'") } else { s }
        })
        .collect();
    Some(parts.join(" "))
}

/// (ppid, comm) from /proc/PID/stat.
pub fn read_stat(pid: u32) -> Option<(u32, String)> {
    let raw = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // comm is in parentheses and may itself contain ") ".
    let open = raw.iter().position(|&b| b == b'(')?;
    let close = raw.iter().rposition(|&b| b == b')')?;
    let comm = escape::bytes(&raw[open + 1..close]);
    let rest = std::str::from_utf8(&raw[close + 1..]).ok()?;
    let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
    Some((ppid, comm))
}

/// Every live process's parent, from /proc.
pub fn all_parents() -> HashMap<u32, u32> {
    let mut out = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            if let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok())
                && let Some((ppid, _)) = read_stat(pid)
            {
                out.insert(pid, ppid);
            }
        }
    }
    out
}

/// Live descendants of `root` (not including it).
pub fn descendants(root: u32) -> Vec<u32> {
    let parents = all_parents();
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (&child, &parent) in &parents {
            if parent == p && child != root && !out.contains(&child) {
                out.push(child);
                frontier.push(child);
            }
        }
    }
    out
}

/// A tmpfs file mapped into a process.
#[derive(Clone, Debug)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`, bytes.
    pub file_offset: u64,
    pub dev: u32,
    pub ino: u64,
    /// File name as the kernel gave it (escaped), "parent/name" when nested.
    pub name: Option<String>,
    /// i_size when mapped.
    pub size: i64,
}

/// Per-process tmpfs mappings: enough to resolve a fault address.
#[derive(Default)]
pub struct MappingTable {
    by_pid: HashMap<u32, Vec<Mapping>>,
}

impl MappingTable {
    pub fn add(&mut self, pid: u32, m: Mapping) {
        let v = self.by_pid.entry(pid).or_default();
        remove_range(v, m.start, m.end);
        v.push(m);
    }

    pub fn unmap(&mut self, pid: u32, start: u64, len: u64) {
        if let Some(v) = self.by_pid.get_mut(&pid) {
            remove_range(v, start, start.saturating_add(page_up(len)));
        }
    }

    /// mremap: the pages move, keeping their file offsets.
    pub fn remap(&mut self, pid: u32, old: u64, old_len: u64, new: u64, new_len: u64) {
        let Some(v) = self.by_pid.get_mut(&pid) else {
            return;
        };
        let Some(m) = v.iter().find(|m| m.start <= old && old < m.end).cloned() else {
            return;
        };
        remove_range(v, old, old + page_up(old_len));
        v.push(Mapping {
            start: new,
            end: new + page_up(new_len),
            file_offset: m.file_offset + (old - m.start),
            ..m
        });
    }

    pub fn fork(&mut self, parent: u32, child: u32) {
        if let Some(v) = self.by_pid.get(&parent).cloned() {
            self.by_pid.insert(child, v);
        }
    }

    pub fn clear(&mut self, pid: u32) {
        self.by_pid.remove(&pid);
    }

    /// Processes mapping each file, by (dev, ino).
    pub fn holders(&self) -> HashMap<(u32, u64), std::collections::BTreeSet<u32>> {
        let mut out: HashMap<(u32, u64), std::collections::BTreeSet<u32>> = HashMap::new();
        for (pid, v) in &self.by_pid {
            for m in v {
                out.entry((m.dev, m.ino)).or_default().insert(*pid);
            }
        }
        out
    }

    pub fn find(&self, pid: u32, addr: u64) -> Option<&Mapping> {
        self.by_pid
            .get(&pid)?
            .iter()
            .rev()
            .find(|m| m.start <= addr && addr < m.end)
    }
}

fn page_up(len: u64) -> u64 {
    len.div_ceil(4096) * 4096
}

/// Cuts [start, end) out of the mappings, splitting those it overlaps.
fn remove_range(v: &mut Vec<Mapping>, start: u64, end: u64) {
    let mut out = Vec::with_capacity(v.len() + 1);
    for m in v.drain(..) {
        if m.end <= start || m.start >= end {
            out.push(m);
            continue;
        }
        if m.start < start {
            out.push(Mapping {
                end: start,
                ..m.clone()
            });
        }
        if m.end > end {
            out.push(Mapping {
                start: end,
                file_offset: m.file_offset + (end - m.start),
                ..m.clone()
            });
        }
    }
    *v = out;
}

/// Reads tmpfs-looking file mappings of `pid` from /proc/PID/maps, for
/// processes that mapped before shmtrace attached. `is_tmpfs(dev)` decides.
pub fn scan_maps(pid: u32, is_tmpfs: impl Fn(u32) -> bool) -> Vec<Mapping> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines() {
        // start-end perms offset maj:min inode path
        let mut f = line.splitn(6, ' ');
        let (Some(range), Some(_perms), Some(off), Some(dev), Some(ino)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let path = f.next().unwrap_or("").trim_start();
        let Ok(ino) = ino.parse::<u64>() else {
            continue;
        };
        if ino == 0 {
            continue;
        }
        let Some((s, e)) = range.split_once('-') else {
            continue;
        };
        let Some((maj, min)) = dev.split_once(':') else {
            continue;
        };
        let (Ok(s), Ok(e), Ok(off), Ok(maj), Ok(min)) = (
            u64::from_str_radix(s, 16),
            u64::from_str_radix(e, 16),
            u64::from_str_radix(off, 16),
            u32::from_str_radix(maj, 16),
            u32::from_str_radix(min, 16),
        ) else {
            continue;
        };
        let dev = crate::mounts::kdev(maj, min);
        if !is_tmpfs(dev) {
            continue;
        }
        let name = path.trim_end_matches(" (deleted)");
        out.push(Mapping {
            start: s,
            end: e,
            file_offset: off,
            dev,
            ino,
            name: Some(escape::str(name.rsplit('/').next().unwrap_or(name))),
            size: -1,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(start: u64, end: u64, off: u64) -> Mapping {
        Mapping {
            start,
            end,
            file_offset: off,
            dev: 1,
            ino: 2,
            name: None,
            size: 0,
        }
    }

    #[test]
    fn unmap_splits_and_remap_moves() {
        let mut t = MappingTable::default();
        t.add(1, m(0x10000, 0x20000, 0));
        t.unmap(1, 0x14000, 0x1000);
        assert!(t.find(1, 0x14000).is_none());
        let off = |t: &MappingTable, a: u64| t.find(1, a).map(|m| m.file_offset + (a - m.start));
        assert_eq!(off(&t, 0x15000), Some(0x5000));
        assert_eq!(off(&t, 0x13000), Some(0x3000));
        t.remap(1, 0x15000, 0x1000, 0x90000, 0x2000);
        assert_eq!(off(&t, 0x91000), Some(0x6000));
        assert!(t.find(1, 0x15000).is_none());
        t.fork(1, 2);
        assert!(t.find(2, 0x91000).is_some());
        t.clear(1);
        assert!(t.find(1, 0x91000).is_none());
    }
}
