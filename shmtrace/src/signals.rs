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

pub fn errno_name(e: i32) -> &'static str {
    match e {
        1 => "EPERM",
        2 => "ENOENT",
        9 => "EBADF",
        12 => "ENOMEM",
        13 => "EACCES",
        17 => "EEXIST",
        19 => "ENODEV",
        22 => "EINVAL",
        23 => "ENFILE",
        24 => "EMFILE",
        27 => "EFBIG",
        28 => "ENOSPC",
        75 => "EOVERFLOW",
        122 => "EDQUOT",
        _ => "?",
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
