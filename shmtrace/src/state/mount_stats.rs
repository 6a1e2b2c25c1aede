//! Each tmpfs mount's size and use, followed over time: what the report's
//! mounts and the metrics show.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::host::mountinfo::{Mount, Usage};
use crate::{escape, event::Dev};

/// A tmpfs mount's size and use, followed over time.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct MountStat {
    /// As its users see it (a container's is `/dev/shm`).
    pub mountpoint: Option<String>,
    /// Where the host has it, when that differs.
    pub host_mountpoint: Option<String>,
    pub dev: Dev,
    /// The mount namespace it was found in.
    pub mount_ns: u32,
    /// The namespace it is shown as seen from (its users', a container's).
    #[serde(skip)]
    pub view_ns: u32,
    /// Its size (size= of the tmpfs).
    pub size_bytes: Option<u64>,
    /// Bytes in use at the last sample.
    pub used_bytes: Option<u64>,
    /// Bytes free at the last sample.
    pub free_bytes: Option<u64>,
    /// The most ever in use: samples, the use read at each tmpfs event and at each failure.
    pub peak_used_bytes: u64,
    /// Bytes of the files shmtrace tracks on it.
    pub tracked_bytes: u64,
    /// tracked_bytes / used_bytes: how much of the use is explained.
    pub explained_share: Option<f64>,
    /// Set when the mount is larger than what a writer's memory cgroup
    /// leaves for shared memory: it can never fill; the cgroup's OOM killer
    /// strikes first (checked once a second, before any failure).
    pub memory_headroom: Option<String>,
    /// The facts of that warning (worded into `memory_headroom` by
    /// analysis).
    #[serde(skip)]
    pub headroom: Option<super::headroom::Headroom>,
    /// What its writers' memory cgroup leaves for shared memory (the limit
    /// less the rest of its use), when one has a limit.
    pub memory_room_bytes: Option<u64>,
}

/// Every tmpfs mount that holds tracked files or failures, or is some
/// namespace's /dev/shm, by device.
#[derive(Default)]
pub struct MountStats {
    by_dev: BTreeMap<Dev, MountStat>,
    /// The highest use any event or failure showed, by device: a mount can
    /// fill and empty between two samples (statfs, once a second).
    seen_peaks: BTreeMap<Dev, u64>,
}

impl MountStats {
    /// Every mount followed, in device order.
    pub fn all(&self) -> impl Iterator<Item = &MountStat> {
        self.by_dev.values()
    }

    pub fn get(&self, dev: Dev) -> Option<&MountStat> {
        self.by_dev.get(&dev)
    }

    #[cfg(test)]
    pub(crate) fn all_mut(&mut self) -> impl Iterator<Item = &mut MountStat> {
        self.by_dev.values_mut()
    }

    /// What a writer's memory cgroup leaves the mount (`room`), and the
    /// warning when the mount is larger than that.
    pub fn set_memory_room(
        &mut self,
        dev: Dev,
        view_ns: u32,
        room: Option<u64>,
        headroom: impl FnOnce(&MountStat) -> Option<super::headroom::Headroom>,
    ) {
        if let Some(s) = self.by_dev.get_mut(&dev) {
            s.view_ns = view_ns;
            s.memory_room_bytes = room;
            s.headroom = headroom(s);
        }
    }

    /// Keeps only these devices (mounts of namespaces let go leave).
    pub fn retain(&mut self, devs: &std::collections::BTreeSet<Dev>) {
        self.by_dev.retain(|d, _| devs.contains(d));
        self.seen_peaks.retain(|d, _| devs.contains(d));
    }

    /// `used` bytes of `dev` were in use at an event (the superblock's
    /// counters the kernel read, or the mount as it stood at a failure):
    /// the peak is a true maximum, not the highest of the samples.
    pub fn saw_use(&mut self, dev: Dev, used: u64) {
        let p = self.seen_peaks.entry(dev).or_default();
        *p = (*p).max(used);
        if let Some(s) = self.by_dev.get_mut(&dev) {
            s.peak_used_bytes = s.peak_used_bytes.max(used);
        }
    }

    /// One measurement of `m`: its use (when statfs answered) and the bytes
    /// of the files tracked on it.
    pub fn observe(
        &mut self,
        m: &Mount,
        host_mountpoint: Option<String>,
        ns: u32,
        usage: Option<Usage>,
        tracked: u64,
    ) {
        let s = self.by_dev.entry(m.dev).or_insert_with(|| MountStat {
            mountpoint: None,
            host_mountpoint: None,
            dev: m.dev,
            mount_ns: ns,
            view_ns: ns,
            size_bytes: None,
            used_bytes: None,
            free_bytes: None,
            peak_used_bytes: 0,
            tracked_bytes: 0,
            explained_share: None,
            memory_headroom: None,
            headroom: None,
            memory_room_bytes: None,
        });
        s.tracked_bytes = tracked;
        s.peak_used_bytes = s
            .peak_used_bytes
            .max(self.seen_peaks.get(&m.dev).copied().unwrap_or(0));
        s.mountpoint = Some(escape::str(&m.mountpoint));
        // The host's name outlives its unmount (a container stopped).
        if host_mountpoint.is_some() {
            s.host_mountpoint = host_mountpoint;
        }
        if let Some(u) = usage {
            s.size_bytes = Some(u.size_bytes);
            s.used_bytes = Some(u.used_bytes);
            s.free_bytes = Some(u.free_bytes());
            s.peak_used_bytes = s.peak_used_bytes.max(u.used_bytes);
            s.explained_share =
                (u.used_bytes > 0).then(|| (tracked as f64 / u.used_bytes as f64).min(1.0));
        }
    }
}
