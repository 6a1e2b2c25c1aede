//! Byte counts for humans.

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

#[cfg(test)]
mod tests {
    #[test]
    fn units() {
        assert_eq!(super::human_bytes(1023), "1023 B");
        assert_eq!(super::human_bytes(64 << 20), "64.0 MiB");
        assert_eq!(super::human_bytes(3 << 29), "1.5 GiB");
    }
}
