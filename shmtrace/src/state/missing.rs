//! Segments found gone: who removed a /dev/shm file, and an open that then
//! found no file by that name (PyTorch's "unable to open shared memory
//! object </torch_...>: No such file or directory", Python's
//! FileNotFoundError on SharedMemory(name)).

use super::{
    State,
    causes::{Cause, Reason},
    evidence::Noted,
    failures::Failure,
    removals::{Removal, Where},
};
use crate::{
    event::{Dev, Header},
    host::Host,
};

/// How long an open that found a name gone waits before it counts: a
/// process that creates the name meanwhile was only looking for it.
pub const MISSING_GRACE_NS: u64 = 200_000_000;
/// Opens held back at most; past that they count at once.
const MAX_HELD: usize = 64;

impl State {
    /// An unlink of a /dev/shm file (any process's: a cleanup job that
    /// removes a running job's segments is what this is for).
    pub(super) fn on_unlink(
        &mut self,
        host: &mut dyn Host,
        h: &Header,
        path: &str,
        dir_dev: Option<Dev>,
    ) {
        let at = match dir_dev {
            Some(dev) if !path.starts_with('/') => {
                Where::Mount(dev, path.trim_start_matches("./").to_string())
            }
            _ => self.where_is(host, h.mnt_ns, h.pid, path),
        };
        if let Where::Mount(dev, name) = &at {
            self.evidence.noted(
                *dev,
                Noted {
                    ts_ns: h.ts_ns,
                    pid: h.pid,
                    comm: h.comm.clone(),
                    kind: crate::event::Kind::Unlinked,
                    name: Some(crate::escape::str(name)),
                    sizes: None,
                },
            );
        }
        let container = self
            .container_of_id(host, h.cgroup_id)
            .filter(|c| c.runtime.is_some())
            .map(|c| c.label());
        self.removals.removed(
            at,
            Removal {
                pid: h.pid,
                ppid: h.ppid,
                comm: h.comm.clone(),
                ts_ns: h.ts_ns,
                path: crate::escape::str(path),
                container,
            },
        );
    }

    /// Where absolute `path` of namespace `ns` lives: a tmpfs mount's
    /// device and the name under it (the same key for the remover and the
    /// opener, whatever their views), else the path itself.
    pub(super) fn where_is(&mut self, host: &mut dyn Host, ns: u32, pid: u32, path: &str) -> Where {
        let tmpfs = |s: &Self| {
            s.mounts
                .for_path(ns, path)
                .filter(|m| m.is_tmpfs())
                .map(|m| (m.dev, m.mountpoint.clone()))
        };
        // A namespace never read is read once; a known one is not read
        // again per unlink (PyTorch unlinks every batch): exec and failures
        // refresh it.
        if !self.mounts.knows_ns(ns) {
            self.refresh_mounts(host, ns, pid);
        }
        let found = tmpfs(self);
        match found {
            Some((dev, mp)) => {
                let rel = path
                    .strip_prefix(mp.as_str())
                    .unwrap_or(path)
                    .trim_start_matches('/');
                Where::Mount(dev, rel.to_string())
            }
            None => Where::Path(ns, path.to_string()),
        }
    }

    /// An open of absolute `raw_path` found no file: explained by the last
    /// removal of that name, then held back for [`MISSING_GRACE_NS`].
    pub(super) fn on_missing(&mut self, host: &mut dyn Host, mut f: Failure, raw_path: &str) {
        let at = self.where_is(host, f.mnt_ns, f.pid, raw_path);
        f.reason = Reason::SegmentGone;
        f.why = Cause::SegmentGone;
        f.removed_by = self.removals.removal_of(&at, f.ts_ns).cloned();
        // Evidence read now, while the process most likely lives: the
        // failure is recorded only after the grace, when it may be gone.
        f.libraries = self.libraries_of(host, f.pid);
        if self.missing.len() >= MAX_HELD {
            self.record(host, f);
        } else {
            self.missing.push((f, at));
        }
    }

    /// `pid` created `name` on `dev`: an open of that name it made just
    /// before was a lookup (attach or create), not a failure.
    pub(super) fn created_after_missing(&mut self, pid: u32, dev: Dev, name: &str) {
        if self.missing.is_empty() {
            return;
        }
        self.missing.retain(|(f, at)| {
            // `name` is the kernel's, escaped; `n` the path as passed.
            !(f.pid == pid
                && matches!(at, Where::Mount(d, n) if *d == dev && crate::escape::str(n) == name))
        });
    }

    /// Opens that found a name gone and were not followed by its creation
    /// within the grace period become failures (all of them when `now_ns`
    /// is `u64::MAX`: the end).
    pub fn settle(&mut self, host: &mut dyn Host, now_ns: u64) {
        if self.missing.is_empty() {
            return;
        }
        let (due, held): (Vec<_>, Vec<_>) = std::mem::take(&mut self.missing)
            .into_iter()
            .partition(|(f, _)| now_ns.saturating_sub(f.ts_ns) >= MISSING_GRACE_NS);
        self.missing = held;
        for (f, _) in due {
            self.record(host, f);
        }
    }
}

/// Opens of a gone name that are no failure: glibc's sem_open tries the
/// name before it creates it, and PyTorch's torch_shm_manager opens
/// segments its clients may already have freed.
pub(super) fn is_lookup(path: &str, comm: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or_default();
    name.starts_with("sem.") || comm == "torch_shm_manag"
}
