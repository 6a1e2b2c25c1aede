//! Mount tables as /proc/PID/mountinfo gives them, and a mount's size and
//! use as statfs gives it: the values the host reads, which state keeps.

use serde::Serialize;

use crate::event::Dev;

/// One line of mountinfo that matters to us.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    pub dev: Dev,
    pub mountpoint: String,
    pub fstype: String,
    /// Mounted noexec: mapping its files with PROT_EXEC fails (EPERM).
    pub noexec: bool,
}

impl Mount {
    pub fn is_tmpfs(&self) -> bool {
        self.fstype == "tmpfs"
    }
}

/// Parses /proc/PID/mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() < 6 || fields.len() < sep + 3 {
            continue;
        }
        let Some((maj, min)) = fields[2].split_once(':') else {
            continue;
        };
        let (Ok(maj), Ok(min)) = (maj.parse(), min.parse()) else {
            continue;
        };
        out.push(Mount {
            dev: Dev::new(maj, min),
            mountpoint: unescape_octal(fields[4]),
            fstype: fields[sep + 1].to_string(),
            noexec: fields[5].split(',').any(|o| o == "noexec"),
        });
    }
    out
}

/// mountinfo writes space, tab, newline and backslash as \ooo.
fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Size and use of a mount, in bytes.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Usage {
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub inodes: u64,
    pub inodes_used: u64,
}

impl Usage {
    pub fn free_bytes(&self) -> u64 {
        self.size_bytes.saturating_sub(self.used_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_octal_escapes_are_read() {
        let m = parse_mountinfo(
            "31 22 0:27 / /mnt/my\\040dir rw,noexec - tmpfs none rw\n\
             bad line\n\
             32 22 0:28 / /a\\134b rw - ext4 /dev/x rw\n",
        );
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mountpoint, "/mnt/my dir");
        assert!(m[0].noexec && m[0].is_tmpfs());
        assert_eq!(m[1].mountpoint, "/a\\b");
        assert!(!m[1].noexec && !m[1].is_tmpfs());
    }

    #[test]
    fn free_bytes_never_go_below_zero() {
        let u = Usage {
            size_bytes: 10,
            used_bytes: 12,
            inodes: 0,
            inodes_used: 0,
        };
        assert_eq!(u.free_bytes(), 0);
    }

    #[test]
    fn lines_without_a_separator_or_a_device_are_skipped() {
        let m = parse_mountinfo(
            "30 22 0:26 / /dev/shm rw shared:4 tmpfs tmpfs rw\n\
             31 22 x:y / /a rw - tmpfs none rw\n\
             32 22 0:27 / /b rw - tmpfs none rw\n",
        );
        assert_eq!(m.len(), 1);
        assert_eq!(
            (m[0].dev, m[0].mountpoint.as_str()),
            (Dev::new(0, 27), "/b")
        );
    }
}
