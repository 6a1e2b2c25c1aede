//! Byte counts and durations for humans, and the sizes they are made of.

/// One mebibyte: --shm-size and tmpfs size= count in these.
pub const MIB: u64 = 1 << 20;

/// The kernel's page size: what a tmpfs allocates in, and the unit of its
/// superblock's counters (4 KiB on x86_64; 16 or 64 KiB on some arm64
/// kernels). Asked of the kernel once.
pub fn page_size() -> u64 {
    static PAGE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|p| u64::try_from(p).ok())
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096)
    })
}

pub fn human_bytes(b: u64) -> String {
    const K: f64 = 1024.0;
    let f = b as f64;
    if f >= K * K * K {
        format!("{:.1} GiB", f / (K * K * K))
    } else if f >= K * K {
        format!("{:.1} MiB", f / (K * K))
    } else if f >= K {
        format!("{:.1} KiB", f / K)
    } else {
        format!("{b} B")
    }
}

/// "850 µs", "12.3 ms", "4.2 s", "3.0 min".
pub fn human_duration_ns(ns: u64) -> String {
    let f = ns as f64;
    if ns < 1_000_000 {
        format!("{:.0} µs", f / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.1} ms", f / 1e6)
    } else if ns < 120_000_000_000 {
        format!("{:.1} s", f / 1e9)
    } else {
        format!("{:.1} min", f / 60e9)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations() {
        assert_eq!(super::human_duration_ns(850_000), "850 µs");
        assert_eq!(super::human_duration_ns(12_300_000), "12.3 ms");
        assert_eq!(super::human_duration_ns(4_200_000_000), "4.2 s");
        assert_eq!(super::human_duration_ns(180_000_000_000), "3.0 min");
    }

    #[test]
    fn units() {
        assert_eq!(super::human_bytes(1023), "1023 B");
        assert_eq!(super::human_bytes(64 << 20), "64.0 MiB");
        assert_eq!(super::human_bytes(3 << 29), "1.5 GiB");
    }

    #[test]
    fn the_page_size_is_the_kernels() {
        let p = super::page_size();
        assert!(p.is_power_of_two() && p >= 4096, "{p}");
        // SAFETY: sysconf has no preconditions.
        let libc_says = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
        assert_eq!(p, libc_says);
        assert_eq!(super::MIB, 1 << 20);
    }
}
