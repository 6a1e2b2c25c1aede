//! What stands in /dev/shm besides the job itself at a failure: files
//! left behind by exited processes, and the memory cgroup that caps it.

use crate::{
    state::{
        failures::{Failure, FailureKind},
        files::FileState,
    },
    units::human_bytes,
};

use super::scope::Scope;

/// /dev/shm pages count against the writer's memory cgroup: a mount (or a
/// recommended size) larger than what the cgroup leaves for shared memory
/// cannot be filled; the cgroup's OOM killer strikes first.
pub(super) fn memory_headroom(first: &Failure, recommended: Option<u64>) -> Option<String> {
    if first.kind == FailureKind::OomKill {
        return None;
    }
    let m = first.memcg.as_ref()?;
    let limit = m.limit_bytes?;
    let room = limit.saturating_sub(m.usage_bytes.saturating_sub(m.shmem_bytes.unwrap_or(0)));
    let size = first.mount.as_ref().and_then(|x| x.size_bytes).unwrap_or(0);
    let want = recommended.unwrap_or(0).max(size);
    (want > room).then(|| {
        format!(
            "the failing process is held to a limit: {} allows {} and leaves about {} for shared memory: a /dev/shm of {} can never fill, the OOM killer strikes first; raise the memory limit with it (Kubernetes sizes a Memory emptyDir at min(sizeLimit, the pod's memory limit) since 1.32)",
            super::causes::limit_holder(m, "its"),
            human_bytes(limit),
            human_bytes(room),
            human_bytes(want)
        )
    })
}

/// Named files on the first failure's mount that nobody holds and whose
/// creator had exited before the failure, largest first.
pub(super) fn leftovers<'a>(r: &Scope<'a>) -> Vec<&'a FileState> {
    let Some(first) = r.first_failure else {
        return Vec::new();
    };
    let mut v: Vec<&FileState> = r
        .files
        .iter()
        .copied()
        .filter(|f| Some(f.dev) == first.dev && !f.unlinked && f.allocated_bytes > 0)
        .filter(|f| f.fd_holders.is_empty() && f.map_holders.is_empty())
        .filter(|f| {
            let creator = f
                .creator
                .and_then(|pid| r.processes.iter().find(|p| p.pid == pid));
            creator
                .and_then(|p| p.exit_ts_ns)
                .is_some_and(|t| t < first.ts_ns)
        })
        .collect();
    v.sort_by_key(|f| std::cmp::Reverse(f.allocated_bytes));
    v
}

pub(super) fn describe_leftovers(r: &Scope, left: &[&FileState], bytes: u64) -> Option<String> {
    let first = r.first_failure?;
    if left.is_empty() {
        return None;
    }
    let mp = shown_mountpoint(first);
    let whose = |f: &FileState| {
        f.creator
            .and_then(|pid| r.processes.iter().find(|p| p.pid == pid))
            .map(|p| format!("pid {} ({})", p.pid, p.comm))
            .unwrap_or_else(|| "an exited process".into())
    };
    let listed: Vec<String> = left
        .iter()
        .take(5)
        .map(|f| {
            format!(
                "{mp}/{} ({}, made by {})",
                f.name.as_deref().unwrap_or("?"),
                human_bytes(f.allocated_bytes),
                whose(f)
            )
        })
        .collect();
    let more = match left.len() {
        n if n > 5 => format!(" and {} more", n - 5),
        _ => String::new(),
    };
    Some(format!(
        "{} file(s), {}, nobody held: {}{more}. Remove them: {}",
        left.len(),
        human_bytes(bytes),
        listed.join(", "),
        remove_command(
            &mp,
            &left
                .iter()
                .map(|f| (f.name.as_deref(), f.ino))
                .collect::<Vec<_>>()
        )
    ))
}

/// Files on the failing mount that no traced process made: there before
/// tracing began, or made by processes shmtrace does not trace. Whether
/// anyone still uses them is not known: said so.
pub(super) fn describe_strays(first: &Failure) -> Option<String> {
    if first.strays.is_empty() {
        return None;
    }
    let mp = shown_mountpoint(first);
    let listed: Vec<String> = first
        .strays
        .iter()
        .take(5)
        .map(|s| format!("{mp}/{} ({})", s.name, human_bytes(s.bytes)))
        .collect();
    let more = match first.stray_count {
        n if n > 5 => format!(" and {} more", n - 5),
        _ => String::new(),
    };
    let all_listed = first.stray_count as usize == first.strays.len();
    Some(format!(
        "{} file(s), {} of the {} in use, made by no process shmtrace traced (there before tracing began, or made by processes it does not trace): {}{more}. If nothing uses them (an earlier job's leftovers), removing them frees {}{}",
        first.stray_count,
        human_bytes(first.stray_bytes),
        first
            .mount
            .as_ref()
            .and_then(|m| m.used_bytes)
            .map(human_bytes)
            .unwrap_or_else(|| "bytes".into()),
        listed.join(", "),
        human_bytes(first.stray_bytes),
        if all_listed {
            format!(
                ": {}",
                remove_command(
                    &mp,
                    &first
                        .strays
                        .iter()
                        .map(|s| (Some(s.name.as_str()), s.ino))
                        .collect::<Vec<_>>()
                )
            )
        } else {
            String::new()
        }
    ))
}

/// The failing mount as the failing process saw it.
fn shown_mountpoint(first: &Failure) -> String {
    first
        .mount
        .as_ref()
        .and_then(|m| m.mountpoint.clone())
        .unwrap_or_else(|| "/dev/shm".into())
}

/// `rm` of plain names; a name with anything a shell could misread (it is
/// escaped in reports) is removed by inode instead.
fn remove_command(mp: &str, left: &[(Option<&str>, u64)]) -> String {
    let plain = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-+@%=:,".contains(&b))
    };
    if plain(mp.trim_start_matches('/').replace('/', "").as_str())
        && left.iter().all(|(name, _)| name.is_some_and(plain))
    {
        let files: Vec<String> = left
            .iter()
            .map(|(name, _)| format!("{mp}/{}", name.unwrap_or("")))
            .collect();
        return format!("rm -- {}", files.join(" "));
    }
    let inums: Vec<String> = left.iter().map(|(_, ino)| format!("-inum {ino}")).collect();
    format!(
        "find {} -xdev \\( {} \\) -delete",
        if plain(mp.trim_start_matches('/').replace('/', "").as_str()) {
            mp
        } else {
            "/dev/shm"
        },
        inums.join(" -o ")
    )
}
