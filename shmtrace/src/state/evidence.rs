//! The timeline kept as evidence: the last events on each tmpfs mount (shown
//! with the first failure there), and how many events of each kind came.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::{
    event::{Dev, Kind},
    units::human_bytes,
};

/// Events kept per mount.
const RECENT: usize = 8;

/// One event on a mount, kept as it came: most are pushed out unread, so
/// the line is written only when a failure shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Noted {
    pub ts_ns: u64,
    pub pid: u32,
    pub comm: String,
    /// The event's kind (open, mmap, ftruncate, unlink...).
    pub kind: Kind,
    /// The file's name, escaped.
    pub name: Option<String>,
    /// Size and allocation of the file at the event (None for an unlink).
    pub sizes: Option<(u64, u64)>,
}

impl Noted {
    /// "+0.028104s pid 20786 (demo_worker_2) open NAME (size 0 B, 0 B
    /// allocated)", its time in seconds as `since` gives it.
    pub fn line(&self, since: impl Fn(u64) -> f64) -> String {
        let mut line = format!(
            "+{:.6}s pid {} ({}) {} {}",
            since(self.ts_ns),
            self.pid,
            self.comm,
            self.kind.name(),
            self.name.as_deref().unwrap_or("?"),
        );
        if let Some((size, allocated)) = self.sizes {
            line.push_str(&format!(
                " (size {}, {} allocated)",
                human_bytes(size),
                human_bytes(allocated)
            ));
        }
        line
    }
}

#[derive(Default)]
pub struct Evidence {
    recent: HashMap<Dev, VecDeque<Noted>>,
    events_seen: u64,
    by_kind: BTreeMap<Kind, u64>,
}

impl Evidence {
    /// Events applied, in all.
    pub fn events_seen(&self) -> u64 {
        self.events_seen
    }

    /// Events applied, by name.
    pub fn by_kind(&self) -> &BTreeMap<Kind, u64> {
        &self.by_kind
    }

    pub fn counted(&mut self, kind: Kind) {
        self.events_seen += 1;
        *self.by_kind.entry(kind).or_default() += 1;
    }

    /// An event on mount `dev`; the oldest goes past RECENT.
    pub fn noted(&mut self, dev: Dev, n: Noted) {
        let q = self.recent.entry(dev).or_default();
        if q.len() >= RECENT {
            q.pop_front();
        }
        q.push_back(n);
    }

    /// The last events on `dev` as lines, times in seconds as `since`
    /// gives them.
    pub fn recent_on(&self, dev: Dev, since: impl Fn(u64) -> f64) -> Vec<String> {
        self.recent
            .get(&dev)
            .map(|q| q.iter().map(|n| n.line(&since)).collect())
            .unwrap_or_default()
    }

    pub fn forget_dev(&mut self, dev: Dev) {
        self.recent.remove(&dev);
    }
}

/// Libraries that tell who uses shared memory, by the file name a process
/// maps (`/proc/PID/maps`): (prefix of the name, what it is).
const LIBRARIES: &[(&str, &str)] = &[
    ("libtorch", "libtorch"),
    ("libnccl", "libnccl"),
    ("libcudart", "libcudart"),
    ("libcuda.so", "libcuda"),
    ("_raylet", "ray"),
];

/// The known libraries among a process's mapped file names, once each, in
/// [`LIBRARIES`] order.
pub fn libraries<'a>(names: impl Iterator<Item = &'a str>) -> Vec<&'static str> {
    let mut found = [false; LIBRARIES.len()];
    for n in names {
        if let Some(i) = LIBRARIES.iter().position(|(p, _)| n.starts_with(p)) {
            found[i] = true;
        }
    }
    LIBRARIES
        .iter()
        .zip(found)
        .filter(|(_, f)| *f)
        .map(|((_, what), _)| *what)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_are_named_once_each() {
        let maps = [
            "libc.so.6",
            "libtorch_cpu.so",
            "libtorch_python.so",
            "libcudart.so.13",
            "_raylet.so",
            "libnccl.so.2",
        ];
        assert_eq!(
            libraries(maps.into_iter()),
            ["libtorch", "libnccl", "libcudart", "ray"]
        );
        assert!(libraries(["python3.11", "libcuda_fake"].into_iter()).is_empty());
    }

    fn noted(ts_ns: u64, kind: Kind, sizes: Option<(u64, u64)>) -> Noted {
        Noted {
            ts_ns,
            pid: 7,
            comm: "w".into(),
            kind,
            name: Some("seg".into()),
            sizes,
        }
    }

    #[test]
    fn keeps_the_last_events_per_mount_and_writes_them_when_asked() {
        let since = |t: u64| (t - 1_000_000_000) as f64 / 1e9;
        let mut e = Evidence::default();
        for i in 0..12 {
            e.noted(
                Dev(1),
                noted(1_000_000_000 + i * 1000, Kind::Opened, Some((4096, 0))),
            );
        }
        e.noted(Dev(2), noted(2_500_000_000, Kind::Unlinked, None));
        let r = e.recent_on(Dev(1), since);
        assert_eq!(r.len(), RECENT);
        assert_eq!(
            r[0],
            "+0.000004s pid 7 (w) open seg (size 4.0 KiB, 0 B allocated)"
        );
        assert_eq!(
            e.recent_on(Dev(2), since),
            vec!["+1.500000s pid 7 (w) unlink seg".to_string()]
        );
        assert!(e.recent_on(Dev(3), since).is_empty());
        e.counted(Kind::Fork);
        e.counted(Kind::Fork);
        assert_eq!((e.events_seen, e.by_kind[&Kind::Fork]), (2, 2));
    }
}
