//! The files in a tmpfs mount's top directory, read through a process's
//! root (`/proc/ANCHOR/root/dev/shm`): no link is followed (the directory
//! is opened O_NOFOLLOW and must be on the mount's device; each name is
//! stat'ed relative to it, AT_SYMLINK_NOFOLLOW) and no file is opened.

use std::ffi::CString;

use nix::{
    dir::Dir,
    fcntl::{AtFlags, OFlag},
    sys::stat::{Mode, fstat, fstatat},
};

use super::{FileStat, procfs::file_stat};
use crate::{escape, event::Dev};

/// Names read at most: a directory of millions of files costs a bounded
/// read (what was not read is counted, not listed).
pub const MAX_ENTRIES: usize = 4096;

/// A directory's regular files, by escaped name, and how many entries were
/// past [`MAX_ENTRIES`]. None when `root` is not a directory on `dev`.
pub fn list_under(dev: Dev, root: &str) -> Option<(Vec<(String, FileStat)>, u64)> {
    let mut dir = Dir::open(
        root,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    // A planted link on the way (a container's /dev) leads elsewhere.
    if super::procfs::dev_of(fstat(&dir).ok()?.st_dev) != dev {
        return None;
    }
    let mut names: Vec<CString> = Vec::new();
    let mut skipped = 0u64;
    for entry in dir.iter().flatten() {
        let name = entry.file_name();
        if matches!(name.to_bytes(), b"." | b"..") {
            continue;
        }
        if names.len() >= MAX_ENTRIES {
            skipped += 1;
            continue;
        }
        names.push(name.to_owned());
    }
    let files = names
        .iter()
        .filter_map(|n| {
            let st = fstatat(&dir, n.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
            let f = file_stat(&st);
            (f.regular && f.dev == dev).then(|| (escape::bytes(n.to_bytes()), f))
        })
        .collect();
    Some((files, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_regular_files_and_refuses_links_and_other_devices() {
        let d = std::env::temp_dir().join(format!("shmtrace-listing-{}", std::process::id()));
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("a\nb"), b"xyz").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.join("link")).unwrap();
        let dev = super::super::procfs::dev_of(std::os::unix::fs::MetadataExt::dev(
            &std::fs::metadata(&d).unwrap(),
        ));
        let (files, skipped) = list_under(dev, d.to_str().unwrap()).unwrap();
        assert_eq!(skipped, 0);
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a\\x0ab"], "escaped, no dir, no link");
        assert_eq!(files[0].1.size, 3);
        // The directory through a link: refused.
        let via = d.with_extension("link");
        std::os::unix::fs::symlink(&d, &via).unwrap();
        assert!(list_under(dev, via.to_str().unwrap()).is_none());
        // Another device's directory: refused.
        assert!(list_under(Dev::new(0, 999_999), d.to_str().unwrap()).is_none());
        let _ = std::fs::remove_file(&via);
        let _ = std::fs::remove_dir_all(&d);
    }
}
