//! The traced process tree, as fork/exec/exit events and event headers
//! tell it.

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

use crate::{
    event::{ExitStatus, Handler, Header},
    state::containers::Container,
};

#[derive(Clone, Debug, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Proc {
    /// Its pid (in the host's PID namespace).
    pub pid: u32,
    /// The pid in its own PID namespace, when that differs (a container).
    pub ns_pid: Option<u32>,
    /// Its parent's pid.
    pub ppid: u32,
    /// Its name (the kernel's comm, 15 bytes at most), escaped.
    pub comm: String,
    /// Command line at its last exec (or when first seen), escaped. Read
    /// from /proc only for processes that touch a tmpfs, fail or hold
    /// bytes; until then the program's path from the exec event.
    pub cmdline: Option<String>,
    /// Whether `cmdline` is the one read from /proc (not the exec path).
    #[serde(skip)]
    pub cmdline_read: bool,
    /// Its mount namespace's inode number.
    pub mnt_ns: u32,
    /// Its cgroup v2 id (the kernel's bpf_get_current_cgroup_id).
    pub cgroup_id: u64,
    /// A process shmtrace was asked to trace (the `run` command, `--pid`).
    pub root: bool,
    /// When it was first seen, kernel monotonic nanoseconds.
    pub first_seen_ns: u64,
    /// When it exited, kernel monotonic nanoseconds (null while alive).
    pub exit_ts_ns: Option<u64>,
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed it, when one did.
    pub exit_signal: Option<i32>,
    /// How SIGBUS was last handled on delivery: "default" (fatal) or a handler.
    pub sigbus_handler: Option<String>,
    /// A SIGBUS handler of its own ran at least once.
    pub sigbus_handler_ran: bool,
    /// It raised SIGBUS again itself (PyTorch's worker handler does).
    pub sigbus_reraised: bool,
    /// Bytes of tmpfs pages it allocated that are still live.
    pub allocated_bytes: u64,
    /// Bytes of tmpfs files it keeps alive by an fd or a mapping (a file
    /// shared by several processes counts for each).
    pub held_bytes: u64,
    /// The most `allocated_bytes` ever was.
    pub peak_allocated_bytes: u64,
    /// The most `held_bytes` ever was.
    pub peak_held_bytes: u64,
    /// Its container (runtime, id, pod), when it is in one.
    pub container: Option<Container>,
    /// Its memory cgroup (hierarchy version, path), read while it lived,
    /// when it first created a tmpfs file: an exited process shows the root.
    #[serde(skip)]
    pub memcg: Option<(u8, String)>,
    /// The memory cgroup's id as the kernel read it at its last tmpfs event
    /// or failure (0: none yet): stands for `memcg` until resolved to a
    /// path, after the process has gone as well.
    #[serde(skip)]
    pub memcg_id: u64,
}

impl Proc {
    pub fn new(pid: u32, ppid: u32, ts: u64) -> Self {
        Self {
            pid,
            ns_pid: None,
            ppid,
            comm: String::new(),
            cmdline: None,
            cmdline_read: true,
            mnt_ns: 0,
            cgroup_id: 0,
            memcg: None,
            memcg_id: 0,
            root: false,
            first_seen_ns: ts,
            exit_ts_ns: None,
            exit_code: None,
            exit_signal: None,
            sigbus_handler: None,
            sigbus_handler_ran: false,
            sigbus_reraised: false,
            allocated_bytes: 0,
            held_bytes: 0,
            peak_allocated_bytes: 0,
            peak_held_bytes: 0,
            container: None,
        }
    }

    pub fn alive(&self) -> bool {
        self.exit_ts_ns.is_none()
    }
}

#[derive(Clone, Debug, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Ancestor {
    /// Its pid.
    pub pid: u32,
    /// Its name.
    pub comm: String,
}

/// Exited processes kept (the most recent), besides those a failure
/// refers to: a node starting 100k processes an hour must not grow.
pub const KEEP_EXITED: usize = 2048;

#[derive(Default)]
pub struct ProcessTree {
    procs: BTreeMap<u32, Proc>,
    /// Exited pids, oldest first (a pid may have been reused since).
    exit_order: VecDeque<u32>,
    /// Exited processes forgotten so far.
    forgotten: u64,
}

impl ProcessTree {
    /// Exited processes let go over the cap.
    pub fn forgotten(&self) -> u64 {
        self.forgotten
    }

    /// What an event header says about its process: name, parent, namespace, cgroup.
    pub fn seen(&mut self, h: &Header) {
        // A pid reused after an exit we kept: a new process.
        if self
            .procs
            .get(&h.pid)
            .and_then(|p| p.exit_ts_ns)
            .is_some_and(|t| h.ts_ns > t)
        {
            self.procs.remove(&h.pid);
            self.forgotten += 1;
        }
        let p = self
            .procs
            .entry(h.pid)
            .or_insert_with(|| Proc::new(h.pid, h.ppid, h.ts_ns));
        // A process is named by its main thread: Ray's and others' worker
        // threads carry names of their own ("store.io", "nexting_thread").
        if h.tid == h.pid || p.comm.is_empty() {
            p.comm.clone_from(&h.comm);
        }
        if h.ppid != 0 {
            p.ppid = h.ppid;
        }
        p.mnt_ns = h.mnt_ns;
        p.cgroup_id = h.cgroup_id;
        if h.ns_pid != 0 && h.ns_pid != h.pid {
            p.ns_pid = Some(h.ns_pid);
        }
        // Moved to another memory cgroup: where its pages go now.
        if h.memcg_id != 0 && h.memcg_id != p.memcg_id {
            p.memcg_id = h.memcg_id;
            p.memcg = None;
        }
    }

    /// A process found in /proc (`--pid`, node-wide seeding) or started by `run`.
    pub fn adopted(&mut self, p: Proc) {
        let e = self.procs.entry(p.pid).or_insert_with(|| p.clone());
        if e.comm.is_empty() {
            e.comm = p.comm;
        }
        if p.cmdline.is_some() {
            e.cmdline = p.cmdline;
        }
        e.root |= p.root;
        e.mnt_ns = p.mnt_ns;
    }

    /// `parent` forked `child`: the child starts with the parent's command line.
    /// Returns true when the pid was reused: an exited process of that pid
    /// was still kept, and is now forgotten (counted) like a reaped one.
    pub fn forked(&mut self, h: &Header, child: u32) -> bool {
        let reused = self.procs.get(&child).is_some_and(|p| !p.alive());
        if reused {
            self.forgotten += 1;
            self.exit_order.retain(|&pid| pid != child);
        }
        let mut p = Proc::new(child, h.pid, h.ts_ns);
        p.comm.clone_from(&h.comm);
        p.mnt_ns = h.mnt_ns;
        p.cgroup_id = h.cgroup_id;
        p.cmdline = self.procs.get(&h.pid).and_then(|pp| pp.cmdline.clone());
        self.procs.insert(child, p);
        reused
    }

    /// `pid` runs a new program: its name from the kernel's event stands
    /// for its command line until one is worth reading (`cmdline_read`).
    pub fn execed(&mut self, pid: u32, filename: String) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.cmdline = Some(filename);
            p.cmdline_read = false;
        }
    }

    /// The command line was read (or could not be: the program's name stays).
    pub fn cmdline_read(&mut self, pid: u32, cmdline: Option<String>) {
        if let Some(p) = self.procs.get_mut(&pid) {
            if let Some(c) = cmdline {
                p.cmdline = Some(c);
            }
            p.cmdline_read = true;
        }
    }

    pub fn exited(&mut self, pid: u32, ts_ns: u64, status: ExitStatus) {
        if let Some(p) = self.procs.get_mut(&pid)
            && p.exit_ts_ns.is_none()
        {
            p.exit_ts_ns = Some(ts_ns);
            p.exit_signal = status.signal;
            p.exit_code = status.code;
            self.exit_order.push_back(pid);
        }
    }

    /// Forgets the oldest exited processes beyond [`KEEP_EXITED`], except
    /// roots and those `pinned` (a failure refers to them). Returns the pids
    /// forgotten, for the other components to let go of.
    pub fn reap(&mut self, pinned: impl Fn(u32) -> bool) -> Vec<u32> {
        let mut gone = Vec::new();
        let mut kept = VecDeque::new();
        while self.exit_order.len() > KEEP_EXITED {
            let Some(pid) = self.exit_order.pop_front() else {
                break;
            };
            match self.procs.get(&pid) {
                // Reused by a live process since: not ours to forget.
                Some(p) if p.alive() => {}
                Some(p) if p.root || pinned(pid) => kept.push_back(pid),
                Some(_) => {
                    self.procs.remove(&pid);
                    self.forgotten += 1;
                    gone.push(pid);
                }
                None => {}
            }
        }
        // Pinned ones stay in order, ahead of the rest.
        while let Some(pid) = kept.pop_back() {
            self.exit_order.push_front(pid);
        }
        gone
    }

    pub fn sigbus_delivered(&mut self, pid: u32, handler: Handler) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.sigbus_handler_ran |= matches!(handler, Handler::Function(_));
            p.sigbus_handler = Some(match handler {
                Handler::Default => "default".into(),
                Handler::Ignore => "ignored".into(),
                Handler::Function(h) => format!("handler {h:#x}"),
            });
        }
    }

    pub fn reraised_sigbus(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.sigbus_reraised = true;
        }
    }

    /// The latest totals from attribution.
    pub fn set_bytes(&mut self, pid: u32, allocated: u64, held: u64, peaks: (u64, u64)) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.allocated_bytes = allocated;
            p.held_bytes = held;
            p.peak_allocated_bytes = peaks.0;
            p.peak_held_bytes = peaks.1;
        }
    }

    /// The pid as the process sees it was read: kept when it differs.
    /// Records where `pid`'s memory is charged (once).
    pub fn set_memcg(&mut self, pid: u32, memcg: Option<(u8, String)>) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.memcg = memcg;
        }
    }

    pub fn has_memcg(&self, pid: u32) -> bool {
        self.get(pid).is_some_and(|p| p.memcg.is_some())
    }

    /// Processes whose memory cgroup the kernel named by an id not yet
    /// resolved to a path: (pid, id).
    pub fn unresolved_memcgs(&self) -> Vec<(u32, u64)> {
        self.procs
            .values()
            .filter(|p| p.memcg.is_none() && p.memcg_id != 0)
            .map(|p| (p.pid, p.memcg_id))
            .collect()
    }

    pub fn set_ns_pid(&mut self, pid: u32, ns_pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid)
            && ns_pid != pid
        {
            p.ns_pid = Some(ns_pid);
        }
    }

    pub fn set_container(&mut self, pid: u32, c: Container) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.container = Some(c);
        }
    }

    pub fn get(&self, pid: u32) -> Option<&Proc> {
        self.procs.get(&pid)
    }

    pub fn contains(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    pub fn all(&self) -> impl Iterator<Item = &Proc> {
        self.procs.values()
    }

    pub fn pids(&self) -> Vec<u32> {
        self.procs.keys().copied().collect()
    }

    pub fn alive(&self) -> impl Iterator<Item = &Proc> {
        self.procs.values().filter(|p| p.alive())
    }

    /// Parents from `pid` up to the first process we do not trace (or a root).
    pub fn ancestry(&self, pid: u32) -> Vec<Ancestor> {
        let mut out = Vec::new();
        let mut cur = self.procs.get(&pid).map(|p| p.ppid);
        while let Some(pp) = cur {
            if pp == 0 || out.len() > 64 {
                break;
            }
            let Some(p) = self.procs.get(&pp) else { break };
            out.push(Ancestor {
                pid: pp,
                comm: p.comm.clone(),
            });
            if p.root {
                break;
            }
            cur = Some(p.ppid);
        }
        out
    }

    /// Every process under `root` (itself included), stopping at other roots.
    pub fn tree_of(&self, root: u32) -> Vec<u32> {
        let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for p in self.procs.values().filter(|p| !p.root && p.pid != p.ppid) {
            children.entry(p.ppid).or_default().push(p.pid);
        }
        let mut pids = vec![root];
        let mut i = 0;
        while i < pids.len() && pids.len() < 100_000 {
            if let Some(c) = children.get(&pids[i]) {
                pids.extend(c.iter().copied().filter(|c| *c != root));
            }
            i += 1;
        }
        pids.sort();
        pids.dedup();
        pids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pid: u32, ppid: u32, ts: u64) -> Header {
        Header {
            ts_ns: ts,
            pid,
            tid: pid,
            ppid,
            comm: format!("p{pid}"),
            ..Default::default()
        }
    }

    #[test]
    fn a_process_is_named_by_its_main_thread() {
        let mut t = ProcessTree::default();
        t.seen(&h(30, 1, 1));
        let mut thread = h(30, 1, 2);
        (thread.tid, thread.comm) = (31, "store.io".into());
        t.seen(&thread);
        assert_eq!(t.get(30).unwrap().comm, "p30");
        // Known only from a thread: its name is better than none.
        let mut first = h(40, 1, 3);
        (first.tid, first.comm) = (41, "worker".into());
        t.seen(&first);
        assert_eq!(t.get(40).unwrap().comm, "worker");
    }

    #[test]
    fn fork_exec_exit_and_ancestry() {
        let mut t = ProcessTree::default();
        let mut root = Proc::new(10, 1, 0);
        root.root = true;
        root.cmdline = Some("python train.py".into());
        t.adopted(root);
        t.forked(&h(10, 1, 5), 11);
        t.forked(&h(11, 10, 6), 12);
        assert_eq!(
            t.get(11).unwrap().cmdline.as_deref(),
            Some("python train.py")
        );
        t.execed(12, "/bin/helper".into());
        assert_eq!(t.get(12).unwrap().cmdline.as_deref(), Some("/bin/helper"));
        let anc: Vec<u32> = t.ancestry(12).iter().map(|a| a.pid).collect();
        assert_eq!(anc, vec![11, 10], "stops at the traced root");
        t.exited(11, 9, ExitStatus::from_kernel(7));
        let p = t.get(11).unwrap();
        assert_eq!(
            (p.exit_signal, p.exit_code, p.alive()),
            (Some(7), None, false)
        );
        assert_eq!(t.alive().count(), 2);
        assert_eq!(t.tree_of(10), vec![10, 11, 12]);
    }

    #[test]
    fn exited_processes_are_forgotten_beyond_the_cap_unless_pinned() {
        let mut t = ProcessTree::default();
        let n = KEEP_EXITED as u32 + 100;
        for pid in 1..=n {
            t.seen(&h(pid, 1, pid as u64));
            t.exited(pid, pid as u64 + 1, ExitStatus::from_kernel(0));
        }
        t.seen(&h(n + 1, 1, 0));
        // pid 5 failed: the report must still say who it was.
        let gone = t.reap(|pid| pid == 5);
        assert_eq!(gone.len(), 99);
        assert_eq!(t.forgotten, 99);
        assert!(t.contains(5) && !t.contains(4) && t.contains(101) && t.contains(n + 1));
        assert_eq!(t.len(), KEEP_EXITED + 2);
        // Reaping again changes nothing: pinned ones do not churn.
        assert!(t.reap(|pid| pid == 5).is_empty());
        // A reused pid is a new, live process.
        t.seen(&h(5, 1, 10_000));
        assert!(t.get(5).unwrap().alive());
    }

    #[test]
    fn a_fork_that_reuses_an_exited_pid_forgets_the_old_process() {
        let mut t = ProcessTree::default();
        t.seen(&h(10, 1, 0));
        assert!(!t.forked(&h(10, 1, 1), 11));
        t.exited(11, 2, ExitStatus::from_kernel(0));
        // pid_max wrapped: 11 is someone else now, counted as forgotten.
        assert!(t.forked(&h(10, 1, 3), 11));
        assert_eq!(t.forgotten, 1);
        assert!(t.get(11).unwrap().alive());
        // Its old exit is no longer queued for reaping.
        t.exited(11, 4, ExitStatus::from_kernel(0));
        assert_eq!(t.exit_order.len(), 1);
    }

    #[test]
    fn headers_and_sigbus_handling() {
        let mut t = ProcessTree::default();
        t.seen(&h(20, 2, 1));
        t.sigbus_delivered(20, Handler::Function(0x1234));
        t.sigbus_delivered(20, Handler::Default);
        t.reraised_sigbus(20);
        let p = t.get(20).unwrap();
        assert!(p.sigbus_handler_ran && p.sigbus_reraised);
        assert_eq!(p.sigbus_handler.as_deref(), Some("default"));
        assert_eq!((p.ppid, p.comm.as_str()), (2, "p20"));
    }
}
