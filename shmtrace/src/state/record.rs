//! Recording a failure: the process it names as the tree knows it, the
//! incident it joins, and, for the first on a mount, who held the bytes,
//! the last events there and the files no traced process made; what is
//! read of the machine is read now, while the process may still be there.

use super::{
    State,
    failures::{Failure, FailureKind, Holder},
    incidents::Place,
};
use crate::{event::Header, host::Host};

impl State {
    /// A failure of `pid` with what the process tree knows of it.
    pub(super) fn base_failure(
        &self,
        kind: FailureKind,
        h: &Header,
        pid: u32,
        tid: u32,
    ) -> Failure {
        let p = self.procs.get(pid);
        let mut f = Failure::new(kind, h.ts_ns, pid, tid);
        f.time_s = self.since_start(h.ts_ns);
        f.ppid = p
            .map(|p| p.ppid)
            .unwrap_or(if pid == h.pid { h.ppid } else { 0 });
        f.comm = p.map(|p| p.comm.clone()).unwrap_or_else(|| h.comm.clone());
        f.ancestry = self.procs.ancestry(pid);
        f.mnt_ns = p.map(|p| p.mnt_ns).unwrap_or(h.mnt_ns);
        f.ns_pid = p
            .and_then(|p| p.ns_pid)
            .or_else(|| (pid == h.pid && h.ns_pid != 0 && h.ns_pid != pid).then_some(h.ns_pid));
        f
    }

    pub(super) fn record(&mut self, host: &mut dyn Host, mut f: Failure) {
        let place = match f.dev {
            Some(dev) => Place::Mount(dev),
            None => Place::Namespace(f.mnt_ns),
        };
        let opened;
        (f.incident, opened) = self.incidents.failed(place, f.mnt_ns, f.ts_ns);
        // The same failure again: counted on the first, no more evidence.
        if self.failures.repeated(&f) {
            return;
        }
        if let Some(dev) = f.dev
            && (opened || self.failures.is_first_on(dev))
        {
            // The first failure of an incident on this mount: refresh who
            // holds what now, while the processes are most likely there.
            self.refresh_files(host);
            f.holders = self
                .files
                .holders_shared_on(dev)
                .into_iter()
                .filter(|&(_, b, _)| b > 0)
                .take(5)
                .map(|(pid, held_bytes, shared_bytes)| Holder {
                    pid,
                    comm: self
                        .procs
                        .get(pid)
                        .map(|p| p.comm.clone())
                        .unwrap_or_default(),
                    held_bytes,
                    shared_bytes,
                })
                .collect();
            f.events_before = self.evidence.recent_on(dev, |t| self.since_start(t));
            (f.strays, f.stray_count, f.stray_bytes) = self.strays_on(host, dev);
        }
        // As the process sees itself: read now, while it may still be there.
        if f.ns_pid.is_none() {
            f.ns_pid = host.ns_pid(f.pid).filter(|&n| n != f.pid);
        }
        if let Some(n) = f.ns_pid {
            self.procs.set_ns_pid(f.pid, n);
        }
        if f.memcg.is_none() {
            f.memcg = self.memcg_now(host, f.pid);
        }
        self.read_cmdline(host, f.pid);
        // Which libraries it runs: evidence of the user when names say
        // little (read while it may still be there; a dead one shows none).
        if f.libraries.is_empty() {
            f.libraries = self.libraries_of(host, f.pid);
        }
        let cgid = self.procs.get(f.pid).map(|p| p.cgroup_id).unwrap_or(0);
        f.container = match self.container_of_id(host, cgid) {
            Some(c) => Some(c),
            None => self.container_of_pid(host, f.pid),
        };
        if let (Some(dev), Some(used)) = (f.dev, f.mount.as_ref().and_then(|m| m.used_bytes)) {
            self.mount_stats.saw_use(dev, used);
        }
        self.failures.recorded(f);
    }

    /// The known libraries `pid` maps now (none once it is gone).
    pub(super) fn libraries_of(&self, host: &mut dyn Host, pid: u32) -> Vec<&'static str> {
        let maps = host.maps(pid);
        super::evidence::libraries(maps.iter().filter_map(|m| m.name.as_deref()))
    }
}
