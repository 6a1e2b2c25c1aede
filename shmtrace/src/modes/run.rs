//! `shmtrace run -- CMD`: start CMD traced from its first instruction,
//! optionally with a private /dev/shm of a given size, and exit with its
//! status.

use std::{
    ffi::CString,
    os::unix::process::{CommandExt, ExitStatusExt},
    process::Command,
    time::Duration,
};

use anyhow::{Context, Result, anyhow};
use nix::{
    mount::{MsFlags, mount},
    sched::{CloneFlags, unshare},
    unistd::{Gid, Uid, User},
};
use shmtrace_common::traced;
use tokio::signal::unix::{SignalKind, signal};

use super::session::{Outputs, Session};
use crate::{
    Fail,
    analysis::{Exit, Report, Verification},
    capture,
};

pub struct RunOpts {
    pub command: Vec<String>,
    /// A private mount namespace with a fresh tmpfs of this many bytes on /dev/shm.
    pub shm_size: Option<u64>,
    /// Run as this user ("root" keeps root). Default: the sudo caller.
    pub user: Option<String>,
    pub outputs: Outputs,
    pub mode: &'static str,
    /// On a shared-memory failure, rerun at the computed size (the control).
    pub verify: bool,
}

/// Who CMD runs as.
struct Identity {
    uid: Uid,
    gid: Gid,
    groups: Vec<Gid>,
}

fn identity(user: Option<&str>) -> Result<Option<Identity>> {
    let lookup = |name: &str| -> Result<User> {
        let u = match name.parse::<u32>() {
            Ok(uid) => User::from_uid(Uid::from_raw(uid))?,
            Err(_) => User::from_name(name)?,
        };
        u.ok_or_else(|| anyhow!("no such user: {name}"))
    };
    let user = match user {
        Some(name) => lookup(name)?,
        None => match std::env::var("SUDO_UID") {
            // Under sudo, run the command as the person who typed it.
            Ok(uid) if nix::unistd::geteuid().is_root() => lookup(&uid)?,
            _ => return Ok(None),
        },
    };
    if user.uid == nix::unistd::geteuid() {
        return Ok(None);
    }
    let cname = CString::new(user.name.clone())?;
    let groups = nix::unistd::getgrouplist(&cname, user.gid).unwrap_or_else(|_| vec![user.gid]);
    Ok(Some(Identity {
        uid: user.uid,
        gid: user.gid,
        groups,
    }))
}

/// `run`, and with `--verify` the control rerun at the computed size.
pub async fn run(opts: RunOpts) -> Result<i32> {
    if opts.mode == "demo" {
        // The demo succeeds when it reproduced a failure and diagnosed it.
        let (report, code) = run_once(&opts, opts.shm_size, opts.outputs.clone()).await?;
        return Ok(if report.facts.first_failure.is_some() {
            eprintln!(
                "shmtrace demo: reproduced and diagnosed (the demo job itself exited with status {code}, as a failing training job does)"
            );
            0
        } else {
            eprintln!(
                "shmtrace demo: the job did not run out of shared memory this time (exit {code})"
            );
            1
        });
    }
    if !opts.verify {
        return Ok(run_once(&opts, opts.shm_size, opts.outputs.clone())
            .await?
            .1);
    }
    // Both runs print their summaries; the report file gets both at the end.
    let inner = Outputs {
        report: None,
        ..opts.outputs.clone()
    };
    let (mut first, code) = run_once(&opts, opts.shm_size, inner.clone()).await?;
    let Some(size) = first
        .diagnosis
        .as_ref()
        .and_then(|d| d.recommended_shm_bytes)
    else {
        eprintln!("shmtrace verify: no shared-memory failure to fix, nothing to rerun");
        if let Some(p) = &opts.outputs.report
            && let Err(e) = crate::output::report::write(&first, p)
        {
            crate::output::report::say_unwritten(p, &e);
        }
        return Ok(code);
    };
    eprintln!(
        "\nshmtrace verify: rerunning the command with a private /dev/shm of {} MiB\n",
        size >> 20
    );
    let (rerun, rerun_code) = run_once(
        &opts,
        Some(size),
        Outputs {
            events: None,
            ..inner
        },
    )
    .await?;
    let gone = rerun.facts.failures.is_empty();
    let verdict = if gone {
        format!(
            "with /dev/shm at {} MiB the command ran without a shared-memory failure (exit {rerun_code}): the fix works",
            size >> 20
        )
    } else {
        format!(
            "with /dev/shm at {} MiB it still failed on shared memory ({}): it needs more, or a consumer keeps every segment alive",
            size >> 20,
            rerun
                .diagnosis
                .as_ref()
                .map(|d| d.signature.as_str())
                .unwrap_or("?")
        )
    };
    eprintln!("shmtrace verify: {verdict}");
    if let Some(p) = &opts.outputs.report {
        first.verify = Some(Verification {
            shm_size_bytes: size,
            failure_gone: gone,
            verdict,
            rerun: Box::new(rerun),
        });
        if let Err(e) = crate::output::report::write(&first, p) {
            crate::output::report::say_unwritten(p, &e);
        }
    }
    Ok(if gone { 0 } else { 1 })
}

async fn run_once(
    opts: &RunOpts,
    shm_size: Option<u64>,
    outputs: Outputs,
) -> Result<(Report, i32)> {
    let Some(program) = opts.command.first() else {
        return Err(anyhow!("no command given: shmtrace run -- CMD [ARGS...]"));
    };
    let ident = identity(opts.user.as_deref())?;
    let mut session = Session::start(outputs, false)?;

    let mut cmd = Command::new(program);
    cmd.args(&opts.command[1..]);
    let tmpfs_opts = shm_size.map(|s| CString::new(format!("size={s},mode=1777")).expect("no NUL"));
    // SAFETY: runs between fork and exec; only async-signal-safe syscalls,
    // on values prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(opts) = &tmpfs_opts {
                unshare(CloneFlags::CLONE_NEWNS)?;
                mount(
                    None::<&str>,
                    "/",
                    None::<&str>,
                    MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                    None::<&str>,
                )?;
                mount(
                    Some("tmpfs"),
                    "/dev/shm",
                    Some("tmpfs"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                    Some(opts.as_c_str()),
                )?;
            }
            if let Some(id) = &ident {
                nix::unistd::setgroups(&id.groups)?;
                nix::unistd::setgid(id.gid)?;
                nix::unistd::setuid(id.uid)?;
            }
            Ok(())
        });
    }

    // shmtrace follows its own forks only while it starts CMD: the kernel
    // then traces CMD from the fork on, before its first instruction.
    let me = std::process::id();
    session.trace(me, traced::FOLLOW)?;
    let spawned = cmd.spawn();
    session.untrace(me);
    let child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let (code, what) = match e.kind() {
                std::io::ErrorKind::NotFound => (127, "command not found".to_string()),
                std::io::ErrorKind::PermissionDenied => (126, "permission denied".to_string()),
                _ => (126, e.to_string()),
            };
            let hint = if shm_size.is_some() && e.raw_os_error() == Some(libc::EPERM) {
                " (a private /dev/shm needs CAP_SYS_ADMIN)"
            } else {
                ""
            };
            return Err(Fail::new(
                code,
                format!("cannot run `{}`: {what}{hint}", crate::escape::str(program)),
            )
            .into());
        }
    };
    let pid = child.id();
    session.add_started(pid, capture::monotonic_ns(), &opts.command);

    let mut child = child;
    let mut waiter = tokio::task::spawn_blocking(move || child.wait());
    // Ctrl-C reaches CMD through the terminal; shmtrace stays to report.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let status = loop {
        tokio::select! {
            st = &mut waiter => break st.context("waiting for the command")??,
            _ = session.step(Duration::from_millis(100)) => {}
            _ = sigint.recv() => {}
            _ = sigterm.recv() => { let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM); }
            _ = sighup.recv() => { let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGHUP); }
        }
    };
    let exit = match (status.code(), status.signal()) {
        (Some(c), _) => Exit {
            code: Some(c),
            signal: None,
            status: c,
        },
        (None, Some(s)) => Exit {
            code: None,
            signal: Some(s),
            status: 128 + s,
        },
        _ => Exit {
            code: None,
            signal: None,
            status: 1,
        },
    };
    let code = exit.status;
    let report = session
        .finish(opts.mode, Some(opts.command.clone()), Some(pid), Some(exit))
        .await?;
    Ok((report, code))
}
