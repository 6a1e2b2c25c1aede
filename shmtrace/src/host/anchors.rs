//! One small process per mount namespace seen, parked inside it: it keeps
//! the namespace (and a private /dev/shm) alive and readable through
//! /proc/ANCHOR/{mountinfo,root} after the traced processes in it are gone,
//! so mounts are resolved and measured even for a job that died at once.

use std::collections::HashMap;

#[derive(Default)]
pub struct Anchors {
    by_ns: HashMap<u32, u32>,
    self_ns: u32,
}

impl Anchors {
    pub fn new(self_ns: u32) -> Self {
        Self {
            by_ns: HashMap::new(),
            self_ns,
        }
    }

    /// The process to look at namespace `ns` through: shmtrace itself for
    /// its own namespace, else an anchor (made now, entering through `via`).
    pub fn ensure(&mut self, ns: u32, via: u32) -> Option<u32> {
        if ns == 0 {
            return None;
        }
        if ns == self.self_ns {
            return Some(std::process::id());
        }
        if let Some(&pid) = self.by_ns.get(&ns) {
            return Some(pid);
        }
        use std::os::unix::fs::MetadataExt;
        let file = std::fs::File::open(format!("/proc/{via}/ns/mnt")).ok()?;
        if file.metadata().ok()?.ino() as u32 != ns {
            return None; // `via` has moved to another namespace since
        }
        use std::os::fd::AsRawFd;
        // The child says when it is inside: until then its /proc files show
        // our namespace, not the one it anchors.
        let (ready_r, ready_w) = nix::unistd::pipe().ok()?;
        // SAFETY: the child only makes async-signal-safe syscalls (prctl,
        // setns, write, pause, _exit) and never returns into Rust code.
        match unsafe { nix::unistd::fork() }.ok()? {
            nix::unistd::ForkResult::Child => {
                // SAFETY: plain syscalls on valid arguments; the name is
                // NUL-terminated and the fds are open in this child.
                unsafe {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    let name = b"shmtrace-anchor\0";
                    libc::prctl(libc::PR_SET_NAME, name.as_ptr());
                    close_all_but(file.as_raw_fd(), ready_w.as_raw_fd());
                    if libc::setns(file.as_raw_fd(), libc::CLONE_NEWNS) != 0 {
                        libc::_exit(1);
                    }
                    libc::write(ready_w.as_raw_fd(), b"1".as_ptr().cast(), 1);
                    loop {
                        libc::pause();
                    }
                }
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop(ready_w);
                let mut byte = [0u8; 1];
                let inside = matches!(nix::unistd::read(&ready_r, &mut byte), Ok(1));
                if !inside {
                    let _ = nix::sys::wait::waitpid(child, None);
                    return None;
                }
                let pid = child.as_raw() as u32;
                self.by_ns.insert(ns, pid);
                Some(pid)
            }
        }
    }

    pub fn namespaces(&self) -> Vec<u32> {
        self.by_ns.keys().copied().collect()
    }

    pub fn get(&self, ns: u32) -> Option<u32> {
        if ns == self.self_ns {
            return Some(std::process::id());
        }
        self.by_ns.get(&ns).copied()
    }

    /// Lets namespace `ns` go: its anchor exits, and the namespace (with a
    /// private /dev/shm and the memory it holds) is freed once nothing else
    /// uses it.
    pub fn release(&mut self, ns: u32) {
        if let Some(pid) = self.by_ns.remove(&ns) {
            reap(pid);
        }
    }
}

/// Closes every descriptor but `a` and `b` in a freshly forked anchor: it
/// must not keep shmtrace's eBPF objects (their last close then waits on
/// the anchor), a listening socket or a caller's pipe alive.
///
/// # Safety
/// Only between fork and _exit: it closes descriptors the rest of the
/// process may still own.
unsafe fn close_all_but(a: i32, b: i32) {
    let (lo, hi) = (a.min(b) as u32, a.max(b) as u32);
    let close = |from: u32, to: u32| {
        if from <= to {
            // SAFETY: close_range(2) on numbers only; async-signal-safe.
            unsafe { libc::syscall(libc::SYS_close_range, from, to, 0) };
        }
    };
    if lo > 0 {
        close(0, lo - 1);
    }
    close(lo + 1, hi.saturating_sub(1));
    close(hi + 1, u32::MAX);
}

fn reap(pid: u32) {
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(pid, None);
}

impl Drop for Anchors {
    fn drop(&mut self) {
        for &pid in self.by_ns.values() {
            reap(pid);
        }
    }
}
