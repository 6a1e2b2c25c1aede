//! Where a failure happened: a device and a kernel file name become a
//! path, an open() path is resolved against its namespace's mounts, and a
//! mount is measured as it stood at the failure (the kernel's counters when
//! the record carries them, else statfs).

use super::{
    State,
    failures::{MountAtFailure, Stray, UsageSource},
};
use crate::{
    event::{Dev, Header, MountPages},
    host::Host,
};

/// (namespace, device) rereads remembered at most (then forgotten at once).
const MAX_REREADS: usize = 4096;

impl State {
    /// "/dev/shm/name" from a device and the kernel's name for the file.
    pub(super) fn file_path(
        &mut self,
        host: &mut dyn Host,
        dev: Dev,
        name: Option<&str>,
        h: &Header,
    ) -> Option<String> {
        let name = name?;
        self.ensure_mount(host, dev, h.mnt_ns, h.pid);
        Some(
            self.mounts
                .path_of(dev, name, Some(h.mnt_ns), host.self_ns()),
        )
    }

    /// Resolves an open*() path to an absolute path on a tmpfs mount.
    pub(super) fn resolve_open_path(
        &mut self,
        host: &mut dyn Host,
        h: &Header,
        dirfd: Option<i32>,
        path: &str,
    ) -> Option<(String, Dev)> {
        let abs = if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{}/{path}", host.dir_of(h.pid, dirfd)?)
        };
        // Mounts change (unshare + mount): read them fresh for a failure.
        self.refresh_mounts(host, h.mnt_ns, h.pid);
        let m = self.mounts.for_path(h.mnt_ns, &abs)?;
        m.is_tmpfs().then(|| (crate::escape::str(&abs), m.dev))
    }

    /// Size and use of mount `dev` at the event: the kernel's superblock
    /// counters read by the eBPF program at that instant when the event
    /// carries them, else statfs right now (exact, but later: a process that
    /// died since may have freed its pages). Inode counts come from statfs.
    pub(super) fn mount_state(
        &mut self,
        host: &mut dyn Host,
        dev: Dev,
        ns: u32,
        pid: u32,
        kernel: Option<MountPages>,
    ) -> Option<MountAtFailure> {
        self.ensure_mount(host, dev, ns, pid);
        // Shown as the failing process sees it; measured where the path
        // and the namespace agree (the host's view, or the process's).
        let self_ns = host.self_ns();
        // The first failure on a mount is rare and worth a fresh read of
        // the host's table for the host's name of a container's mount:
        // device numbers of tmpfs mounts are reused as soon as one goes, so
        // an entry read earlier may be another container's.
        if ns != self_ns && self.failures.is_first_on(dev) {
            let me = host.self_pid();
            self.refresh_mounts(host, self_ns, me);
        }
        let shown = self
            .mounts
            .view(dev, Some(ns), self_ns)
            .map(|m| m.mountpoint.clone());
        let host_mountpoint = shown
            .as_deref()
            .and_then(|s| self.mounts.host_mountpoint(dev, self_ns, s));
        let (ns, mountpoint) = match self.mounts.measure_at(dev) {
            Some((ns, m)) => (ns, Some(m.mountpoint.clone())),
            None => (ns, shown.clone()),
        };
        let mut out = MountAtFailure {
            // Else the kernel's reading (already escaped): the namespace
            // may have gone before its table was read.
            mountpoint: shown
                .as_deref()
                .map(crate::escape::str)
                .or_else(|| self.mounts.kernel_mountpoint(dev).map(String::from)),
            host_mountpoint,
            dev,
            mount_ns: ns,
            size_bytes: None,
            used_bytes: None,
            free_bytes: None,
            inodes: None,
            inodes_used: None,
            source: UsageSource::None,
        };
        if let Some(mp) = &mountpoint {
            let mut via = vec![pid];
            via.extend(self.members_of(ns));
            if let Some(u) = host.statfs(dev, ns, mp, &via) {
                out.size_bytes = Some(u.size_bytes);
                out.used_bytes = Some(u.used_bytes);
                out.free_bytes = Some(u.free_bytes());
                out.inodes = Some(u.inodes);
                out.inodes_used = Some(u.inodes_used);
                out.source = UsageSource::Statfs;
            }
        }
        if let Some(k) = kernel
            && k.dev == dev
            && k.max_pages > 0
        {
            let page = crate::units::page_size();
            let size = k.max_pages * page;
            let used = (k.used_pages * page).min(size);
            out.size_bytes = Some(size);
            out.used_bytes = Some(used);
            out.free_bytes = Some(size - used);
            out.source = UsageSource::Kernel;
        }
        Some(out)
    }

    /// Makes sure device `dev` is in some mount table, reading them if not.
    pub(super) fn ensure_mount(&mut self, host: &mut dyn Host, dev: Dev, ns: u32, pid: u32) {
        // The first event on a device from a namespace: that namespace's
        // table may predate the mount (a container is anchored at its first
        // process, before its runtime bind-mounts its /dev/shm over a copy
        // of the host's table; node-wide, execs reread nothing). A process
        // there reached the device, so the mount is there now: read the
        // table once more, once per namespace and device.
        if ns != 0 && self.mounts.by_dev(dev).is_some() && self.ns_dev_reread.insert((ns, dev)) {
            if self.ns_dev_reread.len() > MAX_REREADS {
                self.ns_dev_reread.clear();
            }
            self.refresh_mounts(host, ns, pid);
        }
        // The host's own table, read at start, may predate the mount (a
        // runtime mounts a container's /dev/shm on the host too): reread
        // once per device, for the host's name of it.
        let self_ns = host.self_ns();
        if ns != self_ns
            && self.mounts.visible_in(self_ns, dev).is_none()
            && self.ns_dev_reread.insert((self_ns, dev))
        {
            let me = host.self_pid();
            self.refresh_mounts(host, self_ns, me);
        }
        if self.mounts.by_dev(dev).is_some() || self.mounts.is_unmounted(dev) {
            return;
        }
        let read = self.refresh_mounts(host, ns, pid);
        if self.mounts.by_dev(dev).is_none() {
            // A device from another namespace: try every anchored one.
            for ns in host.anchored() {
                if let Some(anchor) = host.anchor_of(ns) {
                    self.refresh_mounts(host, ns, anchor);
                }
            }
        }
        if read && self.mounts.by_dev(dev).is_none() {
            self.mounts.mark_unmounted(dev);
        }
    }

    /// Files at the top of mount `dev` that no traced process was seen to
    /// make (largest 10 kept), their count and bytes: read once, at the
    /// first failure there, through the namespace's anchor.
    pub(super) fn strays_on(&self, host: &mut dyn Host, dev: Dev) -> (Vec<Stray>, u64, u64) {
        let Some((ns, m)) = self.mounts.measure_at(dev) else {
            return Default::default();
        };
        let Some((listed, _)) = host.list(dev, ns, &m.mountpoint) else {
            return Default::default();
        };
        let mut v: Vec<Stray> = listed
            .into_iter()
            .filter(|(_, st)| st.allocated > 0 && !self.files.contains((dev, st.ino)))
            .map(|(name, st)| Stray {
                name,
                ino: st.ino,
                bytes: st.allocated,
            })
            .collect();
        v.sort_by_key(|s| std::cmp::Reverse(s.bytes));
        let (count, bytes) = (v.len() as u64, v.iter().map(|s| s.bytes).sum());
        v.truncate(10);
        (v, count, bytes)
    }
}
