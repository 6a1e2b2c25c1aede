//! The failures: shared-memory failures in the order the kernel saw them,
//! SIGBUS that were not, and each mount as it stood at its first failure.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    event::{Addr, Dev},
    state::{containers::Container, procs::Ancestor},
};

/// A tmpfs mount as it stood when a failure happened.
#[derive(Clone, Debug, Serialize)]
pub struct MountAtFailure {
    pub mountpoint: Option<String>,
    pub dev: String,
    pub mount_ns: u32,
    pub size_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    pub inodes: Option<u64>,
    pub inodes_used: Option<u64>,
    /// "kernel": the superblock's counters, read in the kernel at the event;
    /// "statfs": measured by user space right after it; "none": unknown.
    pub source: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct Holder {
    pub pid: u32,
    pub comm: String,
    pub held_bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    pub ts_ns: u64,
    /// Seconds since shmtrace started.
    pub time_s: f64,
    /// Nanoseconds after the first failure (0 for the first).
    pub delay_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub ppid: u32,
    pub comm: String,
    /// sigbus, enospc, edquot, efbig, enomem, mmap_error, mremap_error, oom_kill
    pub kind: &'static str,
    pub syscall: Option<&'static str>,
    pub errno: Option<i32>,
    pub errno_name: Option<&'static str>,
    pub signal: Option<i32>,
    pub si_code: Option<i32>,
    pub si_code_name: Option<&'static str>,
    pub fault_addr: Option<String>,
    pub path: Option<String>,
    pub dev: Option<String>,
    #[serde(skip)]
    pub kdev: Option<Dev>,
    pub ino: Option<u64>,
    pub offset: Option<u64>,
    pub bytes: Option<u64>,
    pub file_size: Option<i64>,
    pub unlinked: Option<bool>,
    /// What the evidence says happened, in words.
    pub cause: String,
    pub mount: Option<MountAtFailure>,
    pub ancestry: Vec<Ancestor>,
    pub mnt_ns: u32,
    /// Times the same access faulted again after a handler returned.
    pub refaults: u32,
    /// The failing process's container (runtime, id, pod), when it is in one.
    pub container: Option<Container>,
    /// For the first failure on a mount: who held its bytes at that moment,
    /// and the last events on that mount before it.
    pub holders: Vec<Holder>,
    pub events_before: Vec<String>,
}

impl Failure {
    /// A failure of `kind` by `pid` at `ts_ns`, every detail still unknown.
    pub fn new(kind: &'static str, ts_ns: u64, pid: u32, tid: u32) -> Self {
        Self {
            ts_ns,
            time_s: 0.0,
            delay_ns: 0,
            pid,
            tid,
            ppid: 0,
            comm: String::new(),
            kind,
            syscall: None,
            errno: None,
            errno_name: None,
            signal: None,
            si_code: None,
            si_code_name: None,
            fault_addr: None,
            path: None,
            dev: None,
            kdev: None,
            ino: None,
            offset: None,
            bytes: None,
            file_size: None,
            unlinked: None,
            cause: String::new(),
            mount: None,
            ancestry: Vec::new(),
            mnt_ns: 0,
            refaults: 0,
            container: None,
            holders: Vec::new(),
            events_before: Vec::new(),
        }
    }
}

/// A SIGBUS that was not on a tmpfs mapping: kept, but not a shm failure.
#[derive(Clone, Debug, Serialize)]
pub struct OtherSignal {
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub sender_pid: u32,
    pub si_code: i32,
    pub si_code_name: &'static str,
    pub fault_addr: String,
    pub reason: &'static str,
}

#[derive(Default)]
pub struct Failures {
    list: Vec<Failure>,
    pub other: Vec<OtherSignal>,
    /// Each mount any failure touched, as it stood at its first failure.
    pub touched: BTreeMap<Dev, MountAtFailure>,
}

impl Failures {
    /// Whether `dev` has had a failure yet.
    pub fn is_first_on(&self, dev: Dev) -> bool {
        !self.touched.contains_key(&dev)
    }

    pub fn recorded(&mut self, f: Failure) {
        if let (Some(m), Some(dev)) = (&f.mount, f.kdev) {
            self.touched.entry(dev).or_insert_with(|| m.clone());
        }
        self.list.push(f);
    }

    /// A handler that returns (Rust's runtime installs one) makes the same
    /// access fault again: counted on the failure it repeats. Returns
    /// whether it was one.
    pub fn refaulted(&mut self, tid: u32, addr: Addr) -> bool {
        let addr = addr.to_string();
        match self
            .list
            .iter_mut()
            .rev()
            .find(|f| f.kind == "sigbus" && f.tid == tid && f.fault_addr.as_deref() == Some(&addr))
        {
            Some(f) => {
                f.refaults += 1;
                true
            }
            None => false,
        }
    }

    pub fn not_shm(&mut self, s: OtherSignal) {
        self.other.push(s);
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn all(&self) -> &[Failure] {
        &self.list
    }

    /// In kernel time order, each with its delay after the first.
    pub fn ordered(&self) -> Vec<Failure> {
        let mut v = self.list.clone();
        v.sort_by_key(|f| f.ts_ns);
        if let Some(first) = v.first().map(|f| f.ts_ns) {
            for f in &mut v {
                f.delay_ns = f.ts_ns - first;
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(dev: u32, used: u64) -> MountAtFailure {
        MountAtFailure {
            mountpoint: Some("/dev/shm".into()),
            dev: Dev(dev).to_string(),
            mount_ns: 1,
            size_bytes: Some(100),
            used_bytes: Some(used),
            free_bytes: Some(100 - used),
            inodes: None,
            inodes_used: None,
            source: "kernel",
        }
    }

    #[test]
    fn ordered_by_kernel_time_and_first_mount_state_kept() {
        let mut fs = Failures::default();
        let mut late = Failure::new("sigbus", 300, 2, 2);
        late.kdev = Some(Dev(40));
        late.mount = Some(at(40, 99));
        let mut early = Failure::new("enospc", 100, 3, 3);
        early.kdev = Some(Dev(40));
        early.mount = Some(at(40, 90));
        assert!(fs.is_first_on(Dev(40)));
        fs.recorded(late);
        fs.recorded(early);
        let v = fs.ordered();
        assert_eq!(v.iter().map(|f| f.pid).collect::<Vec<_>>(), vec![3, 2]);
        assert_eq!(v[1].delay_ns, 200);
        assert_eq!(
            fs.touched[&Dev(40)].used_bytes,
            Some(99),
            "the first recorded stays"
        );
    }

    #[test]
    fn a_refault_is_counted_not_listed() {
        let mut fs = Failures::default();
        let mut f = Failure::new("sigbus", 1, 5, 6);
        f.fault_addr = Some(Addr(0x1000).to_string());
        fs.recorded(f);
        assert!(fs.refaulted(6, Addr(0x1000)));
        assert!(!fs.refaulted(6, Addr(0x2000)));
        assert!(!fs.refaulted(7, Addr(0x1000)));
        assert_eq!((fs.len(), fs.all()[0].refaults), (1, 1));
    }
}
