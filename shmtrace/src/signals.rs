//! Names for signals, SIGBUS si_codes and errnos, as exitsnoop and strace
//! print them.

pub fn describe(sig: i32) -> String {
    let name = match sig {
        1 => "Hangup",
        2 => "Interrupt",
        3 => "Quit",
        4 => "Illegal instruction",
        5 => "Trace/breakpoint trap",
        6 => "Aborted",
        7 => "Bus error",
        8 => "Floating point exception",
        9 => "Killed",
        10 => "User defined signal 1",
        11 => "Segmentation fault",
        12 => "User defined signal 2",
        13 => "Broken pipe",
        14 => "Alarm clock",
        15 => "Terminated",
        _ => "",
    };
    if name.is_empty() {
        format!("signal {sig}")
    } else {
        format!("signal {sig} ({name})")
    }
}

pub fn sigbus_code_name(code: i32) -> &'static str {
    match code {
        1 => "BUS_ADRALN",
        2 => "BUS_ADRERR",
        3 => "BUS_OBJERR",
        4 => "BUS_MCEERR_AR",
        5 => "BUS_MCEERR_AO",
        0 => "SI_USER",
        -1 => "SI_QUEUE",
        -6 => "SI_TKILL",
        0x80 => "SI_KERNEL",
        _ => "?",
    }
}

/// An errno as the kernel headers and strace name it ("ENOSPC"), from
/// nix's table of every errno Linux has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrnoName(pub nix::errno::Errno);

impl ErrnoName {
    pub fn of(e: i32) -> Self {
        Self(nix::errno::Errno::from_raw(e))
    }
}

impl std::fmt::Display for ErrnoName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            nix::errno::Errno::UnknownErrno => f.write_str("?"),
            e => write!(f, "{e:?}"),
        }
    }
}

impl serde::Serialize for ErrnoName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// strerror-like text for the errnos shm failures end in.
pub fn errno_text(e: i32) -> String {
    let s = std::io::Error::from_raw_os_error(e).to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_are_named_as_strace_names_them() {
        assert_eq!(ErrnoName::of(libc::ENOSPC).to_string(), "ENOSPC");
        assert_eq!(ErrnoName::of(libc::EDQUOT).to_string(), "EDQUOT");
        assert_eq!(ErrnoName::of(libc::ENOTTY).to_string(), "ENOTTY");
        assert_eq!(ErrnoName::of(100_000).to_string(), "?");
        assert_eq!(errno_text(libc::ENOSPC), "No space left on device");
    }

    #[test]
    fn signals_and_si_codes_have_their_names() {
        assert_eq!(describe(7), "signal 7 (Bus error)");
        assert_eq!(describe(64), "signal 64");
        assert_eq!(sigbus_code_name(2), "BUS_ADRERR");
        assert_eq!(sigbus_code_name(-6), "SI_TKILL");
        assert_eq!(sigbus_code_name(99), "?");
    }
}
