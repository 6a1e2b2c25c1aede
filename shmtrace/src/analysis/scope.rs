//! What one diagnosis looks at: the whole job (`run`, `--pid`), or one
//! incident node-wide (its mount's failures, and only the processes and
//! files of that mount namespace and device: a PyTorch job in another pod
//! must not make this one "PyTorch").

use super::facts::Facts;
use crate::state::{
    containers::Container,
    failures::Failure,
    files::{FileState, Segments},
    procs::Proc,
};

pub struct Scope<'a> {
    pub first_failure: Option<&'a Failure>,
    /// In kernel time order.
    pub failures: Vec<&'a Failure>,
    pub processes: Vec<&'a Proc>,
    pub files: Vec<&'a FileState>,
    pub segments: &'a Segments,
    /// The first failing process's container, for the runtime's own flag.
    pub container: Option<&'a Container>,
}

impl<'a> Scope<'a> {
    /// Everything: one job, traced on its own.
    pub fn whole(f: &'a Facts) -> Self {
        let first = f.first_failure.as_ref();
        Self {
            first_failure: first,
            failures: f.failures.iter().collect(),
            processes: f.processes.iter().collect(),
            files: f.files.iter().collect(),
            segments: &f.segments,
            container: first.and_then(|x| x.container.as_ref()),
        }
    }

    /// One incident: its failures, the processes of its first failure's
    /// mount namespace, the files on its mount.
    pub fn incident(f: &'a Facts, id: u64) -> Self {
        let failures: Vec<&Failure> = f.failures.iter().filter(|x| x.incident == id).collect();
        let first = failures.first().copied();
        let ns = first.map(|x| x.mnt_ns);
        let dev = first.and_then(|x| x.dev);
        Self {
            first_failure: first,
            processes: f
                .processes
                .iter()
                .filter(|p| Some(p.mnt_ns) == ns)
                .collect(),
            files: f.files.iter().filter(|x| Some(x.dev) == dev).collect(),
            segments: &f.segments,
            container: first.and_then(|x| x.container.as_ref()),
            failures,
        }
    }
}
