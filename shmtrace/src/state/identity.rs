//! Who a process is, asked of the host once and cached in `Containers`:
//! its container (by cgroup id or /proc), and the names of containers and
//! pods (kubelet's logs, the runtime's state). The pid a process sees
//! itself as comes with every event (read in the kernel), not from here.

use super::{State, containers::Container};
use crate::host::Host;

impl State {
    /// The container of `pid`, asking the host once.
    pub(super) fn container_of_pid(&mut self, host: &mut dyn Host, pid: u32) -> Option<Container> {
        if !self.containers.knows_pid(pid)
            && let Some(path) = host.cgroup(pid)
        {
            self.containers.learn_pid(pid, path);
        }
        self.containers.get(pid).cloned()
    }

    /// The container of cgroup id `id`, asking the host on a miss.
    pub(super) fn container_of_id(&mut self, host: &mut dyn Host, id: u64) -> Option<Container> {
        if id > 1
            && !self.containers.knows_id(id)
            && let Some(path) = host.cgroup_path(id)
        {
            self.containers.learn_id(id, path);
        }
        self.containers.of_id(id).cloned()
    }

    /// Names of new containers and pods: a few lookups a tick, each
    /// container tried a bounded number of times (a pod's logs may appear
    /// a moment after its first process).
    pub(super) fn name_containers(&mut self, host: &mut dyn Host) {
        for c in self.containers.unnamed().into_iter().take(8) {
            let names = host.container_names(&c);
            self.containers.looked_up(&c.cgroup, names);
        }
    }
}
