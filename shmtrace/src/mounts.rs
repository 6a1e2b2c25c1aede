//! tmpfs mounts: which mount a kernel device number belongs to (per mount
//! namespace, from /proc/PID/mountinfo), and how full it is (statfs through
//! /proc/PID/root, so other namespaces' /dev/shm are measured from the host).

use std::collections::HashMap;

use serde::Serialize;

/// One line of mountinfo that matters to us.
#[derive(Clone, Debug)]
pub struct Mount {
    /// Kernel-encoded device, as in `super_block.s_dev`.
    pub dev: u32,
    pub mountpoint: String,
    pub fstype: String,
}

impl Mount {
    pub fn is_tmpfs(&self) -> bool {
        self.fstype == "tmpfs"
    }
}

/// Kernel encoding of a device number (MKDEV in the kernel, not glibc's).
pub fn kdev(major: u32, minor: u32) -> u32 {
    (major << 20) | minor
}

pub fn kdev_string(dev: u32) -> String {
    format!("{}:{}", dev >> 20, dev & 0xf_ffff)
}

/// Parses /proc/PID/mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() < 6 || fields.len() < sep + 3 {
            continue;
        }
        let Some((maj, min)) = fields[2].split_once(':') else {
            continue;
        };
        let (Ok(maj), Ok(min)) = (maj.parse(), min.parse()) else {
            continue;
        };
        out.push(Mount {
            dev: kdev(maj, min),
            mountpoint: unescape_octal(fields[4]),
            fstype: fields[sep + 1].to_string(),
        });
    }
    out
}

/// mountinfo writes space, tab, newline and backslash as \ooo.
fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Size and use of a mount, in bytes.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct Usage {
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub inodes: u64,
    pub inodes_used: u64,
}

impl Usage {
    pub fn free_bytes(&self) -> u64 {
        self.size_bytes.saturating_sub(self.used_bytes)
    }
}

/// statfs of `mountpoint` as seen by `pid` (through its root), or by us.
pub fn statfs(pid: Option<u32>, mountpoint: &str) -> Option<Usage> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/root{mountpoint}"),
        None => mountpoint.to_string(),
    };
    let st = nix::sys::statfs::statfs(path.as_str()).ok()?;
    let bsize = st.block_size() as u64;
    Some(Usage {
        size_bytes: st.blocks() * bsize,
        used_bytes: (st.blocks() - st.blocks_free()) * bsize,
        inodes: st.files(),
        inodes_used: st.files() - st.files_free(),
    })
}

/// Mount tables by mount namespace, read lazily and refreshed on demand.
#[derive(Default)]
pub struct MountTables {
    by_ns: HashMap<u32, Vec<Mount>>,
    /// Any tmpfs mount ever seen, by device: tmpfs devices are unique
    /// system-wide, so this answers even after the namespace is gone.
    by_dev: HashMap<u32, Mount>,
    pub anchors: Anchors,
}

impl MountTables {
    pub fn new(self_ns: u32) -> Self {
        Self {
            by_ns: HashMap::new(),
            by_dev: HashMap::new(),
            anchors: Anchors::new(self_ns),
        }
    }

    /// Reads the mountinfo of namespace `ns` (through its anchor, else
    /// through `pid`) into its table.
    pub fn refresh(&mut self, ns: u32, pid: u32) -> bool {
        let reader = self.anchors.ensure(ns, pid).unwrap_or(pid);
        let Ok(text) = std::fs::read_to_string(format!("/proc/{reader}/mountinfo")) else {
            return false;
        };
        let mounts = parse_mountinfo(&text);
        for m in mounts.iter().filter(|m| m.is_tmpfs()) {
            self.by_dev.entry(m.dev).or_insert_with(|| m.clone());
        }
        self.by_ns.insert(ns, mounts);
        true
    }

    /// Drops namespace `ns`'s table; returns the tmpfs devices that only it
    /// had (gone with it).
    pub fn forget_ns(&mut self, ns: u32) -> Vec<u32> {
        let Some(mounts) = self.by_ns.remove(&ns) else {
            return Vec::new();
        };
        mounts
            .into_iter()
            .filter(|m| {
                m.is_tmpfs()
                    && !self
                        .by_ns
                        .values()
                        .any(|ms| ms.iter().any(|o| o.dev == m.dev))
            })
            .map(|m| m.dev)
            .collect()
    }

    /// A namespace where tmpfs `dev` is visible at its mountpoint (where to
    /// measure it): copies of a namespace also list mounts that a later
    /// mount on the same point hides.
    pub fn ns_of_dev(&self, dev: u32) -> Option<u32> {
        self.by_ns
            .iter()
            .find(|(ns, ms)| {
                ms.iter().any(|m| {
                    m.dev == dev && self.for_path(**ns, &m.mountpoint).map(|t| t.dev) == Some(dev)
                })
            })
            .map(|(&ns, _)| ns)
    }

    pub fn by_dev(&self, dev: u32) -> Option<&Mount> {
        self.by_dev.get(&dev)
    }

    /// The mount that holds absolute `path` in namespace `ns` (longest prefix).
    pub fn for_path(&self, ns: u32, path: &str) -> Option<&Mount> {
        // max_by_key keeps the last of equals: the mount stacked on top.
        self.by_ns
            .get(&ns)?
            .iter()
            .filter(|m| under(path, &m.mountpoint))
            .max_by_key(|m| m.mountpoint.len())
    }
}

/// One small process per mount namespace seen, parked inside it: it keeps
/// the namespace (and a private /dev/shm) alive and readable through
/// /proc/ANCHOR/{mountinfo,root} after the traced processes in it are gone,
/// so mounts are resolved and measured even for a job that died at once.
#[derive(Default)]
pub struct Anchors {
    by_ns: HashMap<u32, u32>,
    self_ns: u32,
}

impl Anchors {
    pub fn new(self_ns: u32) -> Self {
        Self {
            by_ns: HashMap::new(),
            self_ns,
        }
    }

    /// The process to look at namespace `ns` through: shmtrace itself for
    /// its own namespace, else an anchor (made now, entering through `via`).
    pub fn ensure(&mut self, ns: u32, via: u32) -> Option<u32> {
        if ns == 0 {
            return None;
        }
        if ns == self.self_ns {
            return Some(std::process::id());
        }
        if let Some(&pid) = self.by_ns.get(&ns) {
            return Some(pid);
        }
        use std::os::unix::fs::MetadataExt;
        let file = std::fs::File::open(format!("/proc/{via}/ns/mnt")).ok()?;
        if file.metadata().ok()?.ino() as u32 != ns {
            return None; // `via` has moved to another namespace since
        }
        use std::os::fd::AsRawFd;
        // The child says when it is inside: until then its /proc files show
        // our namespace, not the one it anchors.
        let (ready_r, ready_w) = nix::unistd::pipe().ok()?;
        // SAFETY: the child only makes async-signal-safe syscalls, then waits.
        match unsafe { nix::unistd::fork() }.ok()? {
            nix::unistd::ForkResult::Child => unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                let name = b"shmtrace-anchor\0";
                libc::prctl(libc::PR_SET_NAME, name.as_ptr());
                if libc::setns(file.as_raw_fd(), libc::CLONE_NEWNS) != 0 {
                    libc::_exit(1);
                }
                libc::write(ready_w.as_raw_fd(), b"1".as_ptr().cast(), 1);
                loop {
                    libc::pause();
                }
            },
            nix::unistd::ForkResult::Parent { child } => {
                drop(ready_w);
                let mut byte = [0u8; 1];
                let inside = matches!(nix::unistd::read(&ready_r, &mut byte), Ok(1));
                if !inside {
                    let _ = nix::sys::wait::waitpid(child, None);
                    return None;
                }
                let pid = child.as_raw() as u32;
                self.by_ns.insert(ns, pid);
                Some(pid)
            }
        }
    }

    pub fn all(&self) -> Vec<(u32, u32)> {
        self.by_ns.iter().map(|(&ns, &pid)| (ns, pid)).collect()
    }

    pub fn get(&self, ns: u32) -> Option<u32> {
        if ns == self.self_ns {
            return Some(std::process::id());
        }
        self.by_ns.get(&ns).copied()
    }
}

impl Anchors {
    /// Lets namespace `ns` go: its anchor exits, and the namespace (with a
    /// private /dev/shm and the memory it holds) is freed once nothing else
    /// uses it.
    pub fn release(&mut self, ns: u32) {
        if let Some(pid) = self.by_ns.remove(&ns) {
            reap(pid);
        }
    }
}

fn reap(pid: u32) {
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(pid, None);
}

impl Drop for Anchors {
    fn drop(&mut self) {
        for &pid in self.by_ns.values() {
            reap(pid);
        }
    }
}

fn under(path: &str, mountpoint: &str) -> bool {
    mountpoint == "/"
        || path == mountpoint
        || (path.starts_with(mountpoint) && path.as_bytes().get(mountpoint.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n\
        30 22 0:26 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw,size=65536k\n\
        31 22 0:27 / /mnt/my\\040dir rw - tmpfs none rw\n\
        32 30 0:28 / /dev/shm/inner rw - tmpfs none rw,size=1024k\n\
        33 30 0:29 / /dev/shm rw - tmpfs none rw,size=2048k\n";

    #[test]
    fn parses_and_finds_longest_prefix() {
        let m = parse_mountinfo(SAMPLE);
        assert_eq!(m.len(), 5);
        assert_eq!(m[1].dev, kdev(0, 26));
        assert_eq!(m[2].mountpoint, "/mnt/my dir");
        let mut t = MountTables::default();
        t.by_ns.insert(1, m);
        // The later mount on the same point hides the earlier one.
        assert_eq!(t.for_path(1, "/dev/shm/torch_1").unwrap().dev, kdev(0, 29));
        assert_eq!(t.for_path(1, "/dev/shm/inner/x").unwrap().dev, kdev(0, 28));
        assert_eq!(t.for_path(1, "/dev/shmx").unwrap().fstype, "ext4");
        assert_eq!(kdev_string(kdev(0, 26)), "0:26");
    }
}
