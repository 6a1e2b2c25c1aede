//! tmpfs mounts: which mount a device belongs to (per mount namespace, from
//! mountinfo text the host reads), and each mount's size and use over time.

use std::collections::{HashMap, HashSet};

pub use crate::host::mountinfo::{Mount, Usage};
use crate::{escape, event::Dev};

/// Mount tables by mount namespace.
#[derive(Default)]
pub struct MountTables {
    by_ns: HashMap<u32, Vec<Mount>>,
    /// Any tmpfs mount ever seen, by device: tmpfs devices are unique
    /// system-wide, so this answers even after the namespace is gone.
    by_dev: HashMap<Dev, Mount>,
    /// shmem devices found in no mount table (memfd, SysV shm).
    unmounted: HashSet<Dev>,
    /// Mount points the eBPF programs read off a file's mount (already
    /// escaped): the answer when a namespace that lived milliseconds could
    /// not be read. Bounded: devices past the cap keep `shmem:` names.
    from_kernel: HashMap<Dev, String>,
}

/// Kernel-read mount points remembered at most.
const MAX_FROM_KERNEL: usize = 4096;

impl MountTables {
    /// Namespace `ns`'s mount table, as just read.
    pub fn learn(&mut self, ns: u32, mounts: Vec<Mount>) {
        for m in mounts.iter().filter(|m| m.is_tmpfs()) {
            self.by_dev.entry(m.dev).or_insert_with(|| m.clone());
        }
        self.by_ns.insert(ns, mounts);
    }

    pub fn knows_ns(&self, ns: u32) -> bool {
        self.by_ns.contains_key(&ns)
    }

    /// `dev` was in no mount table, even its user's: kernel-internal shmem
    /// (memfd, SysV), mounted nowhere, ever. Remembered so that every event
    /// on it does not re-read all mount tables.
    pub fn mark_unmounted(&mut self, dev: Dev) {
        self.unmounted.insert(dev);
    }

    pub fn is_unmounted(&self, dev: Dev) -> bool {
        self.unmounted.contains(&dev)
    }

    /// Drops namespace `ns`'s table; returns the tmpfs devices that only it
    /// had (gone with it).
    pub fn forget_ns(&mut self, ns: u32) -> Vec<Dev> {
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

    /// `dev` as namespace `ns` sees it: its mount there when visible at its
    /// mountpoint (copies of a namespace also list mounts that a later
    /// mount on the same point hides).
    pub fn visible_in(&self, ns: u32, dev: Dev) -> Option<&Mount> {
        self.by_ns
            .get(&ns)?
            .iter()
            .find(|m| m.dev == dev && self.for_path(ns, &m.mountpoint).map(|t| t.dev) == Some(dev))
    }

    /// Where to measure tmpfs `dev`: a namespace where it is visible, with
    /// its mount there (the two always agree: statfs of that path in that
    /// namespace is this device). Lowest namespace first, for stability.
    pub fn measure_at(&self, dev: Dev) -> Option<(u32, &Mount)> {
        let mut nss: Vec<u32> = self.by_ns.keys().copied().collect();
        nss.sort();
        nss.into_iter()
            .find_map(|ns| self.visible_in(ns, dev).map(|m| (ns, m)))
    }

    pub fn ns_of_dev(&self, dev: Dev) -> Option<u32> {
        self.measure_at(dev).map(|(ns, _)| ns)
    }

    /// `dev` as its users see it: a container's `/dev/shm` is `/dev/shm`
    /// to its processes and `.../userdata/shm` to the host. The view from
    /// `ns` (the process at hand) first; else any namespace's `/dev/shm`;
    /// else the host's (`self_ns`); else where it was first seen.
    pub fn view(&self, dev: Dev, ns: Option<u32>, self_ns: u32) -> Option<&Mount> {
        if let Some(m) = ns.and_then(|ns| self.visible_in(ns, dev)) {
            return Some(m);
        }
        let mut nss: Vec<u32> = self.by_ns.keys().copied().collect();
        nss.sort();
        nss.iter()
            .filter_map(|&ns| self.visible_in(ns, dev))
            .find(|m| m.mountpoint == "/dev/shm")
            .or_else(|| self.visible_in(self_ns, dev))
            .or_else(|| self.by_dev(dev))
    }

    /// The namespace whose view [`Self::view`] shows without a process at
    /// hand: a namespace where `dev` is `/dev/shm` (a container's), else
    /// the host's.
    pub fn view_ns(&self, dev: Dev, self_ns: u32) -> u32 {
        let mut nss: Vec<u32> = self.by_ns.keys().copied().collect();
        nss.sort();
        nss.into_iter()
            .find(|&ns| {
                self.visible_in(ns, dev)
                    .is_some_and(|m| m.mountpoint == "/dev/shm")
            })
            .unwrap_or(self_ns)
    }

    /// `dev`'s mountpoint on the host (shmtrace's own namespace), when it
    /// differs from `shown`: where an operator finds it from the node.
    pub fn host_mountpoint(&self, dev: Dev, self_ns: u32, shown: &str) -> Option<String> {
        self.visible_in(self_ns, dev)
            .filter(|m| m.mountpoint != shown)
            .map(|m| escape::str(&m.mountpoint))
    }

    /// `dev`'s mount point as a traced process saw it, read in the kernel.
    pub fn learn_from_kernel(&mut self, dev: Dev, mountpoint: &str) {
        if self.from_kernel.len() < MAX_FROM_KERNEL || self.from_kernel.contains_key(&dev) {
            self.from_kernel.insert(dev, mountpoint.to_string());
        }
    }

    /// The kernel-read mount point of `dev` (see [`Self::learn_from_kernel`]).
    pub fn kernel_mountpoint(&self, dev: Dev) -> Option<&str> {
        self.from_kernel.get(&dev).map(String::as_str)
    }

    pub fn by_dev(&self, dev: Dev) -> Option<&Mount> {
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

    /// "/dev/shm/name" from a device and the kernel's name for the file,
    /// as namespace `ns` sees it (see [`Self::view`]).
    pub fn path_of(&self, dev: Dev, name: &str, ns: Option<u32>, self_ns: u32) -> String {
        match self.view(dev, ns, self_ns) {
            Some(m) if m.mountpoint == "/" => format!("/{name}"),
            Some(m) => format!("{}/{name}", escape::str(&m.mountpoint)),
            None => match self.kernel_mountpoint(dev) {
                Some("/") => format!("/{name}"),
                Some(mp) => format!("{mp}/{name}"),
                None => format!("shmem:{name}"),
            },
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
    use crate::{host::mountinfo::parse_mountinfo, state::mount_stats::MountStats};

    const SAMPLE: &str = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n\
        30 22 0:26 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw,size=65536k\n\
        31 22 0:27 / /mnt/my\\040dir rw - tmpfs none rw\n\
        32 30 0:28 / /dev/shm/inner rw - tmpfs none rw,size=1024k\n\
        33 30 0:29 / /dev/shm rw - tmpfs none rw,size=2048k\n";

    #[test]
    fn parses_and_finds_longest_prefix() {
        let m = parse_mountinfo(SAMPLE);
        assert_eq!(m.len(), 5);
        assert_eq!(m[1].dev, Dev::new(0, 26));
        assert_eq!(m[2].mountpoint, "/mnt/my dir");
        let mut t = MountTables::default();
        t.learn(1, m);
        // The later mount on the same point hides the earlier one.
        assert_eq!(
            t.for_path(1, "/dev/shm/torch_1").unwrap().dev,
            Dev::new(0, 29)
        );
        assert_eq!(
            t.for_path(1, "/dev/shm/inner/x").unwrap().dev,
            Dev::new(0, 28)
        );
        assert_eq!(t.for_path(1, "/dev/shmx").unwrap().fstype, "ext4");
        assert_eq!(Dev::new(0, 26).to_string(), "0:26");
        // The hidden /dev/shm is measured nowhere; the visible one here.
        assert_eq!(t.ns_of_dev(Dev::new(0, 26)), None);
        assert_eq!(t.ns_of_dev(Dev::new(0, 29)), Some(1));
        assert_eq!(t.path_of(Dev::new(0, 29), "a b", None, 1), "/dev/shm/a b");
        assert_eq!(t.path_of(Dev::new(0, 99), "memfd", None, 1), "shmem:memfd");
        // A namespace gone before it was read: the kernel's mount point.
        t.learn_from_kernel(Dev::new(0, 98), "/dev/shm");
        assert_eq!(t.path_of(Dev::new(0, 98), "x", Some(7), 1), "/dev/shm/x");
    }

    #[test]
    fn a_container_sees_its_dev_shm_where_the_host_sees_the_runtime_path() {
        let mut t = MountTables::default();
        let host = "30 22 0:26 / /dev/shm rw - tmpfs tmpfs rw\n\
            41 22 0:40 / /var/lib/containers/storage/overlay-containers/abc/userdata/shm rw - tmpfs shm rw,size=64000k\n";
        let ctr = "50 49 0:41 / / rw - overlay o rw\n51 50 0:40 / /dev/shm rw - tmpfs shm rw\n";
        // The host's table is read first (node-wide), the container's later.
        t.learn(1, parse_mountinfo(host));
        t.learn(9, parse_mountinfo(ctr));
        let dev = Dev::new(0, 40);
        assert_eq!(t.path_of(dev, "x", Some(9), 1), "/dev/shm/x");
        // Without a process at hand: a namespace's /dev/shm still wins.
        assert_eq!(t.view(dev, None, 1).unwrap().mountpoint, "/dev/shm");
        assert_eq!(
            t.host_mountpoint(dev, 1, "/dev/shm").as_deref(),
            Some("/var/lib/containers/storage/overlay-containers/abc/userdata/shm")
        );
        assert_eq!(t.host_mountpoint(Dev::new(0, 26), 1, "/dev/shm"), None);
        // Measured where path and namespace agree.
        let (ns, m) = t.measure_at(dev).unwrap();
        assert_eq!(
            (ns, m.mountpoint.as_str()),
            (
                1,
                "/var/lib/containers/storage/overlay-containers/abc/userdata/shm"
            )
        );
    }

    #[test]
    fn forgetting_a_namespace_returns_only_its_own_tmpfs() {
        let mut t = MountTables::default();
        t.learn(1, parse_mountinfo(SAMPLE));
        t.learn(
            2,
            parse_mountinfo(
                "30 22 0:26 / /dev/shm rw - tmpfs tmpfs rw\n40 22 0:50 / /x rw - tmpfs t rw\n",
            ),
        );
        let mut gone = t.forget_ns(2);
        gone.sort();
        assert_eq!(gone, vec![Dev::new(0, 50)]);
        assert!(!t.knows_ns(2));
    }

    #[test]
    fn stats_keep_the_peak() {
        let mut s = MountStats::default();
        let m = Mount {
            dev: Dev::new(0, 40),
            mountpoint: "/dev/shm".into(),
            fstype: "tmpfs".into(),
            noexec: false,
        };
        let u = |used| Usage {
            size_bytes: 100,
            used_bytes: used,
            inodes: 10,
            inodes_used: 1,
        };
        s.observe(&m, None, 1, Some(u(80)), 40);
        s.observe(&m, None, 1, Some(u(20)), 20);
        let st = s.get(m.dev).unwrap();
        assert_eq!((st.used_bytes, st.peak_used_bytes), (Some(20), 80));
        assert_eq!(st.explained_share, Some(1.0));
    }
}
