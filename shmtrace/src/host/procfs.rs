//! Reads of /proc, statfs, stat and cgroupfs, one function each, as
//! `ProcHost` runs them (on its worker threads): they block, take no
//! state, and answer None (or nothing) when the target is gone.

use std::{collections::HashMap, os::unix::fs::MetadataExt, path::Path};

use super::{FdEntry, FileStat, Limits, Lookup, MapsEntry, mountinfo::Usage};
use crate::{
    escape,
    event::{Addr, Dev},
};

/// /proc/PID/map_files/START-END.
pub fn map_file(pid: u32, start: Addr, end: Addr) -> String {
    format!("/proc/{pid}/map_files/{:x}-{:x}", start.0, end.0)
}

pub fn stat_path(path: &str) -> Option<FileStat> {
    nix::sys::stat::stat(path).ok().map(|st| file_stat(&st))
}

pub fn maps_of(pid: u32) -> Vec<MapsEntry> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|t| parse_maps(&t))
        .unwrap_or_default()
}

/// statfs of `mountpoint` of device `dev`, through the first process of
/// `through` whose root shows it.
pub fn statfs_through(dev: Dev, mountpoint: &str, through: &[u32]) -> Option<Usage> {
    for c in through {
        let path = format!("/proc/{c}/root{mountpoint}");
        let Ok(st) = nix::sys::stat::stat(path.as_str()) else {
            continue;
        };
        if dev_of(st.st_dev) != dev {
            continue;
        }
        if let Some(u) = statfs_path(&path) {
            return Some(u);
        }
    }
    None
}

pub fn lookup_under(dev: Dev, root: &str, rel: &str) -> Lookup {
    // The mount must still be where it was: else a missing name means nothing.
    match nix::sys::stat::stat(root) {
        Ok(st) if dev_of(st.st_dev) == dev => {}
        _ => return Lookup::Unknown,
    }
    match nix::sys::stat::lstat(format!("{root}/{rel}").as_str()) {
        Ok(st) if dev_of(st.st_dev) == dev => Lookup::Found(file_stat(&st)),
        Ok(_) => Lookup::Missing,
        Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR) => Lookup::Missing,
        Err(_) => Lookup::Unknown,
    }
}

/// The pid as the process sees it: the last `NSpid:` entry of its status
/// (its own PID namespace; the same as `pid` on the host).
pub fn ns_pid_of(pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_ns_pid(&text)
}

pub fn parse_ns_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

pub fn limits_of(pid: u32) -> Limits {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let vm_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    let map_count = std::fs::read(format!("/proc/{pid}/maps"))
        .ok()
        .map(|b| b.iter().filter(|&&c| c == b'\n').count() as u64);
    let fds_open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()
        .map(|d| d.count() as u64);
    let (memcg_limit, memcg_usage) = memcg_of(pid);
    Limits {
        address_space: rlimit(pid, libc::RLIMIT_AS),
        file_size: rlimit(pid, libc::RLIMIT_FSIZE),
        open_files: rlimit(pid, libc::RLIMIT_NOFILE),
        vm_bytes: vm_kb.map(|k| k * 1024),
        map_count,
        fds_open,
        max_map_count: read_u64("/proc/sys/vm/max_map_count"),
        memcg_limit,
        memcg_usage,
    }
}

pub fn fds_of(pid: u32) -> Option<Vec<FdEntry>> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(st) = nix::sys::stat::stat(&e.path()) else {
            continue;
        };
        let stat = file_stat(&st);
        if !stat.regular {
            continue;
        }
        let name = std::fs::read_link(e.path())
            .ok()
            .map(|l| last_component(&l));
        out.push(FdEntry { fd, stat, name });
    }
    // A process that exited during the listing lost its later fds midway
    // (and a zombie lists none): its books wait for its exit event.
    if has_exited(pid) {
        return None;
    }
    Some(out)
}

pub fn dev_of(st_dev: u64) -> Dev {
    Dev::new(libc::major(st_dev), libc::minor(st_dev))
}

pub fn file_stat(st: &nix::sys::stat::FileStat) -> FileStat {
    FileStat {
        dev: dev_of(st.st_dev),
        ino: st.st_ino,
        size: st.st_size,
        allocated: st.st_blocks as u64 * 512,
        nlink: st.st_nlink,
        regular: st.st_mode & libc::S_IFMT == libc::S_IFREG,
    }
}

pub fn last_component(p: &Path) -> String {
    let s = p.to_string_lossy();
    let s = s.trim_end_matches(" (deleted)");
    escape::str(s.rsplit('/').next().unwrap_or(s))
}

/// The soft limit `res` of `pid` (None: unlimited or unknown).
pub fn rlimit(pid: u32, res: libc::__rlimit_resource_t) -> Option<u64> {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit with a null new limit only reads into `old`, a
    // valid, exclusively borrowed rlimit.
    let r = unsafe { libc::prlimit(pid as libc::pid_t, res, std::ptr::null(), &mut old) };
    (r == 0 && old.rlim_cur != libc::RLIM_INFINITY).then_some(old.rlim_cur)
}

pub fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `pid`'s memory cgroup limit and use: v2 first, else v1's memory
/// controller. "max" and v1's huge "unlimited" are None.
pub fn memcg_of(pid: u32) -> (Option<u64>, Option<u64>) {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return (None, None);
    };
    let unlimited = |v: Option<u64>| v.filter(|&v| v < 1 << 60);
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        // Kernel-written paths under cgroupfs: nobody else can plant them.
        if ctrl.is_empty()
            && let Some(root) = v2_root()
        {
            let dir = format!("{root}{path}");
            let max = unlimited(read_u64(&format!("{dir}/memory.max")));
            if max.is_some() {
                return (max, read_u64(&format!("{dir}/memory.current")));
            }
        } else if ctrl.split(',').any(|c| c == "memory") {
            let dir = format!("/sys/fs/cgroup/memory{path}");
            let max = unlimited(read_u64(&format!("{dir}/memory.limit_in_bytes")));
            if max.is_some() {
                return (max, read_u64(&format!("{dir}/memory.usage_in_bytes")));
            }
        }
    }
    (None, None)
}

/// statfs of a path, in bytes.
pub fn statfs_path(path: &str) -> Option<Usage> {
    let st = nix::sys::statfs::statfs(path).ok()?;
    let bsize = st.block_size() as u64;
    Some(Usage {
        size_bytes: st.blocks() * bsize,
        used_bytes: (st.blocks() - st.blocks_free()) * bsize,
        inodes: st.files(),
        inodes_used: st.files() - st.files_free(),
    })
}

/// Inode number of /proc/<who>/ns/mnt.
pub fn mnt_ns_of(who: &str) -> Option<u32> {
    std::fs::metadata(format!("/proc/{who}/ns/mnt"))
        .ok()
        .map(|m| m.ino() as u32)
}

/// Bytes kept of a command line: a node's state must not grow with
/// whatever programs pass as arguments.
pub const CMDLINE_MAX: usize = 4096;

/// Reads /proc/PID/cmdline (at most [`CMDLINE_MAX`] bytes, marked when
/// cut), escaped, arguments joined by spaces.
pub fn read_cmdline(pid: u32) -> Option<String> {
    use std::io::Read;
    let mut raw = Vec::new();
    std::fs::File::open(format!("/proc/{pid}/cmdline"))
        .ok()?
        .take(CMDLINE_MAX as u64 + 1)
        .read_to_end(&mut raw)
        .ok()?;
    if raw.is_empty() {
        return None;
    }
    let cut = raw.len() > CMDLINE_MAX;
    raw.truncate(CMDLINE_MAX);
    let mut parts: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let s = escape::bytes(p);
            if s.contains(' ') { format!("'{s}'") } else { s }
        })
        .collect();
    if cut {
        parts.push(format!("[cut at {CMDLINE_MAX} bytes]"));
    }
    Some(parts.join(" "))
}

/// (ppid, comm) from /proc/PID/stat.
pub fn read_stat(pid: u32) -> Option<(u32, String)> {
    let raw = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&raw)
}

/// Gone, a zombie (state Z or X), or on its way out (PF_EXITING: killed,
/// its address space and fd table torn down before it is a zombie): its
/// fds and maps list empty, or soon will.
pub fn has_exited(pid: u32) -> bool {
    match std::fs::read(format!("/proc/{pid}/stat")) {
        Ok(raw) => {
            matches!(stat_state(&raw), Some(b'Z' | b'X'))
                || stat_flags(&raw).is_some_and(|f| f & PF_EXITING != 0)
        }
        Err(_) => true,
    }
}

/// include/linux/sched.h: set first thing in do_exit.
const PF_EXITING: u64 = 0x4;

/// The state letter of a /proc/PID/stat line (after the comm).
fn stat_state(raw: &[u8]) -> Option<u8> {
    let close = raw.iter().rposition(|&b| b == b')')?;
    raw.get(close + 2).copied()
}

/// The task flags of a /proc/PID/stat line (its 9th field).
fn stat_flags(raw: &[u8]) -> Option<u64> {
    let close = raw.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(raw.get(close + 1..)?).ok()?;
    // state ppid pgrp session tty_nr tpgid flags
    rest.split_whitespace().nth(6)?.parse().ok()
}

pub fn parse_stat(raw: &[u8]) -> Option<(u32, String)> {
    // comm is in parentheses and may itself contain ") ".
    let open = raw.iter().position(|&b| b == b'(')?;
    let close = raw.iter().rposition(|&b| b == b')')?;
    let comm = escape::bytes(&raw[open + 1..close]);
    let rest = std::str::from_utf8(&raw[close + 1..]).ok()?;
    let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
    Some((ppid, comm))
}

/// Live descendants of `root` (not including it), from /proc.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut parents = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            if let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok())
                && let Some((ppid, _)) = read_stat(pid)
            {
                parents.insert(pid, ppid);
            }
        }
    }
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

/// Every pid in /proc but ours.
pub fn all_pids() -> std::io::Result<Vec<u32>> {
    let me = std::process::id();
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .filter(|&p| p != me)
        .collect();
    pids.sort();
    Ok(pids)
}

/// File mappings in /proc/PID/maps text.
pub fn parse_maps(text: &str) -> Vec<MapsEntry> {
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
        let (Some((s, e)), Some((maj, min))) = (range.split_once('-'), dev.split_once(':')) else {
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
        out.push(MapsEntry {
            start: Addr(s),
            end: Addr(e),
            file_offset: off,
            dev: Dev::new(maj, min),
            ino,
            name: Some(last_component(Path::new(path))),
        });
    }
    out
}

/// The cgroup path that names the process's container, from
/// /proc/PID/cgroup text: the v2 line ("0::/...") when it says more than
/// "/", else the v1 memory controller's (hybrid hosts), else the first
/// non-root one.
pub fn container_cgroup(text: &str) -> String {
    let mut v2 = None;
    let mut memory = None;
    let mut any = None;
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if ctrl.is_empty() {
            v2 = Some(path.to_string());
        } else if ctrl.split(',').any(|c| c == "memory") {
            memory = Some(path.to_string());
        } else if path != "/" && any.is_none() {
            any = Some(path.to_string());
        }
    }
    match v2 {
        Some(p) if p != "/" => p,
        _ => memory
            .filter(|p| p != "/")
            .or(any)
            .unwrap_or_else(|| "/".into()),
    }
}

/// Where the cgroup v2 hierarchy is mounted (unified on hybrid hosts).
pub fn v2_root() -> Option<&'static str> {
    let has = |dir: &str, file: &str| Path::new(dir).join(file).exists();
    if has("/sys/fs/cgroup/unified", "cgroup.procs") {
        Some("/sys/fs/cgroup/unified")
    } else if has("/sys/fs/cgroup", "cgroup.controllers") {
        Some("/sys/fs/cgroup")
    } else {
        None
    }
}

/// cgroups remembered from one walk of the hierarchy.
const MAX_CGROUPS: usize = 65536;

/// Every cgroup directory below `dir` (16 deep at most): its inode number,
/// which is the kernel's id for it, -> its path under `root` as `name`
/// writes it.
pub fn walk(
    root: &Path,
    dir: &Path,
    out: &mut HashMap<u64, String>,
    depth: usize,
    name: &dyn Fn(&[u8]) -> String,
) {
    if depth > 16 {
        return;
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir())
            && let Ok(md) = e.metadata()
        {
            let rel = e
                .path()
                .strip_prefix(root)
                .map(|r| format!("/{}", name(r.as_os_str().as_encoded_bytes())))
                .unwrap_or_default();
            if out.len() >= MAX_CGROUPS {
                return;
            }
            out.insert(md.ino(), rel);
            walk(root, &e.path(), out, depth + 1, name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ns_pid_is_the_innermost() {
        assert_eq!(parse_ns_pid("Name:\tpython\nNSpid:\t31613\t9\n"), Some(9));
        assert_eq!(parse_ns_pid("NSpid:\t42\n"), Some(42));
        assert_eq!(parse_ns_pid("Name:\tx\n"), None);
    }

    #[test]
    fn parses_maps_stat_and_cgroup() {
        let m = parse_maps(
            "7f00000000-7f00100000 rw-s 00002000 00:28 1234 /dev/shm/torch_1 (deleted)\n\
             7f00100000-7f00200000 rw-p 00000000 00:00 0 \n",
        );
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].dev, Dev::new(0, 0x28));
        assert_eq!((m[0].file_offset, m[0].ino), (0x2000, 1234));
        assert_eq!(m[0].name.as_deref(), Some("torch_1"));
        assert_eq!(
            parse_stat(b"42 (a) b) S 7 42 42"),
            Some((7, "a) b".to_string()))
        );
        // A zombie's state letter, after a comm holding ") Z".
        assert_eq!(stat_state(b"42 (a) Z b) Z 7 42 42"), Some(b'Z'));
        assert_eq!(stat_state(b"42 (sh) S 7"), Some(b'S'));
        // Killed, not yet a zombie: PF_EXITING (0x4) in the flags.
        let exiting = b"42 (a) b) R 7 42 42 0 -1 4194628 0 0";
        assert_eq!(stat_flags(exiting), Some(4194628));
        assert_ne!(stat_flags(exiting).unwrap() & PF_EXITING, 0);
        assert_eq!(
            stat_flags(b"42 (sh) S 7 42 42 0 -1 4194560 0"),
            Some(4194560)
        );
        assert_eq!(
            container_cgroup("12:memory:/docker/abc\n0::/\n"),
            "/docker/abc"
        );
        assert_eq!(container_cgroup("0::/kubepods/x\n"), "/kubepods/x");
        assert_eq!(container_cgroup("0::/\n"), "/");
    }

    #[test]
    fn a_zombie_has_exited_and_lists_no_fds() {
        // SAFETY: the child only calls _exit, which is async-signal-safe.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: ends the child at once, running nothing of the parent's.
            unsafe { libc::_exit(0) };
        }
        assert!(pid > 0, "fork");
        // Wait for its exit but leave it unreaped: a zombie.
        // SAFETY: a zeroed siginfo_t is valid; waitid only writes it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waits on our own child with a valid siginfo pointer.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        assert_eq!(rc, 0);
        let zombie = pid as u32;
        assert!(has_exited(zombie));
        assert!(fds_of(zombie).is_none(), "a zombie's empty fd list");
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        assert!(has_exited(zombie));
        assert!(!has_exited(std::process::id()));
        assert!(fds_of(std::process::id()).is_some());
    }
}
