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
    pub options: String,
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
        let Some(sep) = fields.iter().position(|f| *f == "-") else { continue };
        if fields.len() < 6 || fields.len() < sep + 3 {
            continue;
        }
        let Some((maj, min)) = fields[2].split_once(':') else { continue };
        let (Ok(maj), Ok(min)) = (maj.parse(), min.parse()) else { continue };
        out.push(Mount {
            dev: kdev(maj, min),
            mountpoint: unescape_octal(fields[4]),
            fstype: fields[sep + 1].to_string(),
            options: fields.get(sep + 3).unwrap_or(&"").to_string(),
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
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
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
}

impl MountTables {
    /// Reads `pid`'s mountinfo into the table of namespace `ns`.
    pub fn refresh(&mut self, ns: u32, pid: u32) -> bool {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) else {
            return false;
        };
        let mounts = parse_mountinfo(&text);
        for m in mounts.iter().filter(|m| m.is_tmpfs()) {
            self.by_dev.entry(m.dev).or_insert_with(|| m.clone());
        }
        self.by_ns.insert(ns, mounts);
        true
    }

    pub fn has_ns(&self, ns: u32) -> bool {
        self.by_ns.contains_key(&ns)
    }

    pub fn by_dev(&self, dev: u32) -> Option<&Mount> {
        self.by_dev.get(&dev)
    }

    /// The mount that holds absolute `path` in namespace `ns` (longest prefix).
    pub fn for_path(&self, ns: u32, path: &str) -> Option<&Mount> {
        self.by_ns.get(&ns)?.iter().rev().filter(|m| under(path, &m.mountpoint)).max_by_key(|m| m.mountpoint.len())
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
        32 30 0:28 / /dev/shm/inner rw - tmpfs none rw,size=1024k\n";

    #[test]
    fn parses_and_finds_longest_prefix() {
        let m = parse_mountinfo(SAMPLE);
        assert_eq!(m.len(), 4);
        assert_eq!(m[1].dev, kdev(0, 26));
        assert_eq!(m[2].mountpoint, "/mnt/my dir");
        let mut t = MountTables::default();
        t.by_ns.insert(1, m);
        assert_eq!(t.for_path(1, "/dev/shm/torch_1").unwrap().dev, kdev(0, 26));
        assert_eq!(t.for_path(1, "/dev/shm/inner/x").unwrap().dev, kdev(0, 28));
        assert_eq!(t.for_path(1, "/dev/shmx").unwrap().fstype, "ext4");
        assert_eq!(kdev_string(kdev(0, 26)), "0:26");
    }
}
