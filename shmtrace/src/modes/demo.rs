//! `shmtrace demo`: a real reproduction of a DataLoader dying of shared
//! memory, with no PyTorch needed. A trainer process starts workers; each
//! worker creates a segment in /dev/shm the way PyTorch does (open, ftruncate,
//! mmap, unlink, fill the pages, pass the fd over a unix socket), and the
//! trainer keeps every batch alive. In a 64 MiB /dev/shm a worker soon faults
//! on a page tmpfs cannot allocate and dies of SIGBUS; the trainer then names
//! a dead worker the way PyTorch does: the lowest pid, not the first to fail
//! (worker 0 starts late, so it is never the first).

use std::{
    io::IoSliceMut,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use nix::{
    cmsg_space,
    sys::{
        socket::{
            AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
            recvmsg, sendmsg, socketpair,
        },
        wait::{WaitPidFlag, WaitStatus, waitpid},
    },
    unistd::{ForkResult, Pid, fork},
};

/// Workload parameters (the hidden `demo-workload` subcommand).
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub workers: u32,
    pub batch_bytes: u64,
}

/// The trainer. Never returns normally: exits like a failing training job.
pub fn trainer(w: Workload) -> Result<i32> {
    set_comm("demo_trainer");
    let mut workers: Vec<(Pid, OwnedFd)> = Vec::new();
    for idx in 0..w.workers {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .context("socketpair")?;
        // SAFETY: single-threaded here; the child only runs the worker loop.
        match unsafe { fork() }.context("fork")? {
            ForkResult::Child => {
                drop(ours);
                worker(idx, w, theirs);
            }
            ForkResult::Parent { child } => {
                drop(theirs);
                workers.push((child, ours));
            }
        }
    }
    println!(
        "demo_trainer: {} workers, {} MiB batches through /dev/shm; keeping every batch alive",
        w.workers,
        w.batch_bytes >> 20
    );

    // Hold every received segment, as a training loop that keeps batches
    // (or a deep prefetch queue) does.
    let mut held: Vec<OwnedFd> = Vec::new();
    let mut dead: Vec<(Pid, WaitStatus)> = Vec::new();
    let mut first_death: Option<Instant> = None;
    loop {
        for (_, sock) in &workers {
            while let Some(fd) = recv_fd(sock.as_raw_fd()) {
                held.push(fd);
                // The worker waits for this before its next batch, so what
                // is in /dev/shm is the trainer's, not in a socket's queue,
                // however slow the machine (a dead worker: nothing to tell).
                let _ = nix::sys::socket::send(sock.as_raw_fd(), &[1], MsgFlags::MSG_NOSIGNAL);
            }
        }
        for (pid, _) in &workers {
            if dead.iter().any(|(p, _)| p == pid) {
                continue;
            }
            match waitpid(*pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => {}
                Ok(st) => {
                    dead.push((*pid, st));
                    first_death.get_or_insert_with(Instant::now);
                }
            }
        }
        // Like PyTorch's SIGCHLD handling: look a moment later, then check
        // the workers in pid order and blame the first dead one found.
        if let Some(t) = first_death
            && t.elapsed() > Duration::from_millis(300)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut by_pid: Vec<(Pid, WaitStatus)> = dead.clone();
    by_pid.sort_by_key(|(p, _)| p.as_raw());
    let (pid, st) = by_pid[0];
    let why = match st {
        WaitStatus::Signaled(_, sig, _) => format!("killed by signal: {}", signal_text(sig as i32)),
        WaitStatus::Exited(_, code) => format!("exited with status {code}"),
        _ => "stopped".into(),
    };
    println!(
        "RuntimeError: DataLoader worker (pid {pid}) is {why}. It is possible that dataloader's workers \
         are out of shared memory. Please try to raise your shared memory limit."
    );
    println!(
        "demo_trainer: held {} batches ({} MiB) when it stopped",
        held.len(),
        (held.len() as u64 * w.batch_bytes) >> 20
    );
    for (pid, _) in &workers {
        let _ = nix::sys::signal::kill(*pid, nix::sys::signal::Signal::SIGKILL);
        let _ = waitpid(*pid, None);
    }
    Ok(1)
}

fn signal_text(sig: i32) -> &'static str {
    match sig {
        7 => "Bus error",
        9 => "Killed",
        11 => "Segmentation fault",
        _ => "signal",
    }
}

/// A worker: segment after segment until tmpfs runs out and a page fault
/// on the fill kills it with SIGBUS.
fn worker(idx: u32, w: Workload, sock: OwnedFd) -> ! {
    set_comm(&format!("demo_worker_{idx}"));
    let pid = std::process::id();
    let size = w.batch_bytes as usize;
    // Worker 0 starts late, so the others fill /dev/shm and one of them
    // fails first; worker 0 fails soon after. The trainer, checking in pid
    // order as PyTorch does, will blame worker 0: the wrong one.
    if idx == 0 {
        std::thread::sleep(Duration::from_millis(150));
    }
    let pause = Duration::from_millis(1 + idx as u64);
    for batch in 0u32.. {
        let name = format!("/dev/shm/shmtrace_demo_{pid}_{batch}");
        let fd = match create_segment(&name, size) {
            Ok(fd) => fd,
            Err(e) => {
                eprintln!("demo_worker_{idx}: {e:#}");
                std::process::exit(1);
            }
        };
        // SAFETY: a fresh shared mapping of our own file; fill touches each page.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            );
            if p == libc::MAP_FAILED {
                eprintln!(
                    "demo_worker_{idx}: mmap: {}",
                    std::io::Error::last_os_error()
                );
                std::process::exit(1);
            }
            let _ = std::fs::remove_file(&name);
            for off in (0..size).step_by(4096) {
                std::ptr::write_volatile((p as *mut u8).add(off), batch as u8 | 1);
            }
            libc::munmap(p, size);
        }
        let payload = batch.to_le_bytes();
        let iov = [std::io::IoSlice::new(&payload)];
        let fds = [fd.as_raw_fd()];
        if sendmsg::<()>(
            sock.as_raw_fd(),
            &iov,
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .is_err()
        {
            std::process::exit(0); // trainer gone
        }
        drop(fd);
        // The trainer's word that it holds the batch (like a DataLoader's
        // bounded prefetch); nothing means the trainer is gone.
        let mut ack = [0u8; 1];
        match nix::sys::socket::recv(sock.as_raw_fd(), &mut ack, MsgFlags::empty()) {
            Ok(1) => {}
            _ => std::process::exit(0),
        }
        std::thread::sleep(pause);
    }
    std::process::exit(0)
}

fn create_segment(name: &str, size: usize) -> Result<OwnedFd> {
    let c = std::ffi::CString::new(name)?;
    // SAFETY: plain syscalls on a path we own.
    unsafe {
        let fd = libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600,
        );
        if fd < 0 {
            bail!(
                "unable to open shared memory object <{name}>: {}",
                std::io::Error::last_os_error()
            );
        }
        let fd = OwnedFd::from_raw_fd(fd);
        if libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) != 0 {
            bail!("ftruncate <{name}>: {}", std::io::Error::last_os_error());
        }
        Ok(fd)
    }
}

fn recv_fd(sock: RawFd) -> Option<OwnedFd> {
    let mut buf = [0u8; 8];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let mut space = cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(
        sock,
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .ok()?;
    for c in msg.cmsgs().ok()? {
        if let ControlMessageOwned::ScmRights(fds) = c
            && let Some(&fd) = fds.first()
        {
            // SAFETY: the kernel just installed this fd for us.
            return Some(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
    None
}

fn set_comm(name: &str) {
    if let Ok(c) = std::ffi::CString::new(name) {
        // SAFETY: PR_SET_NAME copies at most 16 bytes from a valid C string.
        unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr() as libc::c_ulong, 0, 0, 0) };
    }
}
