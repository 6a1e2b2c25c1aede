//! Files written as root in directories other people may write to: never
//! through a name someone could have planted. A report is written to a
//! fresh, randomly named file created with O_EXCL|O_NOFOLLOW beside the
//! target, then renamed over it (readers never see half a report); a target
//! that exists and is not a regular file (a device, a FIFO) is written in
//! place, never replaced.

use std::{
    fs::{File, OpenOptions},
    io::Write,
    os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

/// Replaces `path`'s contents with `bytes`, as described above.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Ok(md) = std::fs::symlink_metadata(path) {
        let t = md.file_type();
        if t.is_dir() {
            bail!("{} is a directory", path.display());
        }
        if t.is_char_device() || t.is_block_device() || t.is_fifo() || t.is_socket() {
            let mut f = open_in_place(path)?;
            return f
                .write_all(bytes)
                .with_context(|| format!("cannot write {}", path.display()));
        }
    }
    let mut tmp = create_beside(path)?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_data())
        .with_context(|| format!("cannot write {}", tmp.path().display()))?;
    // A rename over the target: a symlink there is replaced, not followed.
    // On failure the temporary file is removed when dropped.
    tmp.persist(path).map(drop).map_err(|e| {
        let from = e.file.path().display().to_string();
        anyhow::Error::new(e.error).context(format!("cannot rename {from} to {}", path.display()))
    })
}

/// Opens `path` for a stream of writes (`--events`): created if missing,
/// truncated if a regular file, written in place if a device or FIFO; a
/// symlink is refused (O_NOFOLLOW), whoever planted it.
pub fn create_stream(path: &Path) -> Result<File> {
    if let Ok(md) = std::fs::symlink_metadata(path)
        && !md.file_type().is_file()
        && !md.file_type().is_symlink()
    {
        return open_in_place(path);
    }
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .with_context(|| {
            format!(
                "cannot create {} (a symlink there is refused)",
                path.display()
            )
        })
}

/// Fails early (before tracing) if `path` cannot be a report: its
/// directory is missing or cannot take a new file (read-only, full, no
/// permission: a probe file is created there and removed), or it is a
/// directory. A job that ran for hours must not lose its diagnosis to a
/// path that could never have been written.
pub fn check_target(path: &Path) -> Result<()> {
    let dir = parent(path);
    let md = std::fs::metadata(&dir).with_context(|| {
        format!(
            "cannot write {}: no directory {}",
            path.display(),
            dir.display()
        )
    })?;
    if !md.is_dir() {
        bail!(
            "cannot write {}: {} is not a directory",
            path.display(),
            dir.display()
        );
    }
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        bail!("cannot write {}: it is a directory", path.display());
    }
    // Removed when dropped.
    create_beside(path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Fails early if files cannot be created in the directory `dir` (the
/// incidents directory): a probe file is created there and removed.
pub fn check_dir(dir: &Path) -> Result<()> {
    create_beside(&dir.join("probe")).map(drop)
}

fn open_in_place(path: &Path) -> Result<File> {
    // O_NONBLOCK: a FIFO without a reader fails at once instead of hanging.
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A new file with a random name in `path`'s directory, created with
/// O_EXCL (a planted name, symlink or not, is never opened).
fn create_beside(path: &Path) -> Result<tempfile::NamedTempFile> {
    let dir = parent(path);
    let base = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "report".into());
    tempfile::Builder::new()
        .prefix(&format!(".{base}."))
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(0o644))
        .tempfile_in(&dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("shmtrace-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_symlink_at_the_target_is_replaced_not_followed() {
        let d = dir("symlink");
        let victim = d.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let target = d.join("r.json");
        std::os::unix::fs::symlink(&victim, &target).unwrap();
        // The old fixed temporary name, planted too.
        std::os::unix::fs::symlink(&victim, d.join("r.tmp-shmtrace")).unwrap();
        write_atomic(&target, b"{}\n").unwrap();
        write_atomic(&target, b"{\"a\":1}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "{\"a\":1}\n");
        assert!(std::fs::symlink_metadata(&target).unwrap().is_file());
        let left: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "no temporary file stays behind");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn streams_refuse_symlinks_and_targets_are_checked() {
        let d = dir("stream");
        let victim = d.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let ev = d.join("events.jsonl");
        std::os::unix::fs::symlink(&victim, &ev).unwrap();
        let e = create_stream(&ev).unwrap_err();
        assert!(format!("{e:#}").contains("symlink"), "{e:#}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(check_target(&d.join("missing/r.json")).is_err());
        assert!(check_target(&d).is_err());
        assert!(check_target(&d.join("new.json")).is_ok());
        assert!(check_dir(&d).is_ok());
        // A directory that takes no new file is refused up front (as root
        // a mode does not stop us: a read-only bind mount would; a file
        // standing where the directory should be does for everyone).
        let not_dir = d.join("plain");
        std::fs::write(&not_dir, "").unwrap();
        assert!(check_target(&not_dir.join("r.json")).is_err());
        assert!(check_dir(&not_dir).is_err());
        let left: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "the probe file is removed");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
