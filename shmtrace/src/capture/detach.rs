//! Detaching is slow and nobody should wait for it. Each tracepoint program
//! hangs off a perf event whose last close waits for an RCU grace period
//! under the kernel's event mutex (~70 ms each, ~2 s for every hook), so
//! closing them in parallel does not help. Instead a detached process takes
//! over the last references to the eBPF objects and pays that cost after
//! shmtrace has printed, written and exited.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Forks a holder of this process's eBPF and perf objects and returns the
/// pipe end whose closing lets it exit. Drop the return value after the
/// tracer's own descriptors: the holder's exit then closes the last
/// references. None (the caller closes them itself, slowly) when /proc or
/// fork is unavailable.
pub fn hand_off() -> Option<OwnedFd> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).ok()?;
    // Everything but the kernel objects and the pipe's read end is closed in
    // the holder: a listening socket, the terminal or a caller's pipe must
    // not outlive shmtrace. Gathered here: the child may only make
    // async-signal-safe calls.
    let close: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let fd: i32 = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok();
            let keep = fd == read.as_raw_fd()
                || target.is_some_and(|t| t.to_string_lossy().starts_with("anon_inode:"));
            (!keep).then_some(fd)
        })
        .collect();
    let read_fd = read.as_raw_fd();
    // SAFETY: the child calls only async-signal-safe functions (setsid, fork,
    // close, read, _exit) before it exits; the parent goes on as before.
    match unsafe { libc::fork() } {
        -1 => None,
        0 => {
            // SAFETY: async-signal-safe calls on descriptors this process
            // owns; it never returns into Rust code.
            unsafe {
                // A second fork leaves the holder to init, so it is never a
                // zombie of a shmtrace that goes on (a --verify rerun).
                if libc::fork() != 0 {
                    libc::_exit(0);
                }
                // Out of the terminal's process group: Ctrl-C at the end
                // must not make shmtrace itself pay the detach.
                libc::setsid();
                for &fd in &close {
                    libc::close(fd);
                }
                let mut b = 0u8;
                loop {
                    let n = libc::read(read_fd, (&raw mut b).cast(), 1);
                    if n == 0 || (n < 0 && *libc::__errno_location() != libc::EINTR) {
                        break;
                    }
                }
                libc::_exit(0)
            }
        }
        child => {
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(child), None);
            drop(read);
            // SAFETY: `write` is an open descriptor this function owns;
            // into_raw_fd hands it over exactly once.
            Some(unsafe { OwnedFd::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(write)) })
        }
    }
}
