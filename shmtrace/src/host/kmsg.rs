//! The kernel's own account of an OOM kill, from /dev/kmsg: its
//! `oom-kill:constraint=...,oom_memcg=...,task_memcg=...,task=...,pid=...`
//! line names the memory cgroup whose limit fired, which confirms (or
//! corrects) the one shmtrace computed from the limits on the path. Read
//! without blocking, only at an OOM kill, from where the log stood when
//! shmtrace started; absent where the log cannot be read (no CAP_SYSLOG).

use std::{
    fs::File,
    io::{ErrorKind, Read, Seek, SeekFrom},
    os::unix::fs::OpenOptionsExt,
};

use serde::Serialize;

/// The kernel's OOM line, as it names things.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct OomLine {
    /// CONSTRAINT_MEMCG (a memory cgroup's limit), CONSTRAINT_NONE (the
    /// node's memory), CONSTRAINT_CPUSET, CONSTRAINT_MEMORY_POLICY.
    pub constraint: String,
    /// The memory cgroup whose limit fired (escaped); null when the whole
    /// node ran out.
    pub oom_memcg: Option<String>,
    /// The victim's own memory cgroup (escaped).
    pub task_memcg: Option<String>,
    /// The victim, as the kernel names it.
    pub task: String,
    /// The victim's pid (host PID namespace).
    pub pid: u32,
}

/// Parses one /dev/kmsg record ("PRI,SEQ,TS,FLAGS;MESSAGE").
pub fn parse(record: &str) -> Option<OomLine> {
    let msg = record.split_once(';')?.1.lines().next()?;
    let fields = msg.strip_prefix("oom-kill:")?;
    let mut line = OomLine {
        constraint: String::new(),
        oom_memcg: None,
        task_memcg: None,
        task: String::new(),
        pid: 0,
    };
    // Values have no commas but the cpuset and memcg paths are cgroup
    // names: split on the known keys, in the kernel's order.
    for part in fields.split(',') {
        let Some((k, v)) = part.split_once('=') else {
            continue;
        };
        match k {
            "constraint" => line.constraint = v.to_string(),
            "oom_memcg" => line.oom_memcg = Some(crate::escape::str(v)),
            "task_memcg" => line.task_memcg = Some(crate::escape::str(v)),
            "task" => line.task = crate::escape::str(v),
            "pid" => line.pid = v.parse().ok()?,
            _ => {}
        }
    }
    (line.pid != 0).then_some(line)
}

/// Records read at most per look: a chatty kernel cannot stall the loop.
const MAX_RECORDS: usize = 4096;
/// OOM lines kept for victims whose event has not come yet.
const KEEP: usize = 64;

/// /dev/kmsg, opened non-blocking at the end of the log.
pub struct Kmsg {
    file: Option<File>,
    seen: Vec<OomLine>,
}

impl Kmsg {
    pub fn open() -> Self {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/kmsg")
            .ok()
            .and_then(|mut f| f.seek(SeekFrom::End(0)).ok().map(|_| f));
        Self {
            file,
            seen: Vec::new(),
        }
    }

    /// The kernel's OOM line about `pid`, reading what the log gained
    /// since the last look.
    pub fn oom_line(&mut self, pid: u32) -> Option<OomLine> {
        if let Some(f) = &mut self.file {
            let mut buf = vec![0u8; 8192];
            for _ in 0..MAX_RECORDS {
                match f.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if let Some(l) = parse(&String::from_utf8_lossy(&buf[..n])) {
                            if self.seen.len() >= KEEP {
                                self.seen.remove(0);
                            }
                            self.seen.push(l);
                        }
                    }
                    // Overwritten before we read it: the next one follows.
                    Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => break,
                }
            }
        }
        self.seen.iter().rev().find(|l| l.pid == pid).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oom_kill_line_names_the_cgroup_whose_limit_fired() {
        let rec = "6,1234,17665909,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b.slice,task_memcg=/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b.slice/cri-containerd-abc.scope,task=dd,pid=144,uid=0\n";
        let l = parse(rec).unwrap();
        assert_eq!(l.constraint, "CONSTRAINT_MEMCG");
        assert_eq!(
            l.oom_memcg.as_deref(),
            Some("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b.slice")
        );
        assert!(l.task_memcg.unwrap().ends_with("cri-containerd-abc.scope"));
        assert_eq!((l.task.as_str(), l.pid), ("dd", 144));
        // The node's memory: no oom_memcg.
        let node = parse("3,9,1,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/x,task=a,pid=7,uid=0").unwrap();
        assert_eq!(
            (node.constraint.as_str(), node.oom_memcg),
            ("CONSTRAINT_NONE", None)
        );
        assert!(parse("6,1,1,-;Memory cgroup out of memory: Killed process 144 (dd)").is_none());
        assert!(parse("no semicolon").is_none());
    }
}
