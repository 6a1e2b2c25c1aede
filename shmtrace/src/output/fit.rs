//! Fitting text to a terminal: no line wider than it (cut with an
//! ellipsis, never wrapped), and sections shortened by priority so the
//! screen never scrolls.

/// `s` cut to `width` characters, the last one an ellipsis when cut.
pub fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    if width == 0 {
        return String::new();
    }
    let mut out: String = s.chars().take(width - 1).collect();
    out.push('…');
    out
}

/// `s` fitted to `width` and padded with spaces to exactly that.
pub fn pad(s: &str, width: usize) -> String {
    let s = fit(s, width);
    let n = s.chars().count();
    s + &" ".repeat(width - n)
}

/// A titled list of rows, most important first.
pub struct Section {
    pub title: String,
    pub rows: Vec<String>,
}

/// Lays `sections` (in priority order) into at most `height` lines: each
/// section that fits gets its title and one row first, then the rest of
/// the room goes to the first sections' rows; a section cut short ends
/// with "… N more" (when it shows two rows or more). Blank lines between sections only when there is room.
pub fn allot(sections: &[Section], height: usize) -> Vec<String> {
    let mut shown = vec![0usize; sections.len()];
    let mut left = height;
    let mut included = 0;
    for (i, s) in sections.iter().enumerate() {
        let want = 1 + s.rows.len().min(1);
        if left < want {
            break;
        }
        shown[i] = want - 1;
        left -= want;
        included = i + 1;
    }
    for (i, s) in sections.iter().enumerate().take(included) {
        let more = (s.rows.len() - shown[i]).min(left);
        shown[i] += more;
        left -= more;
    }
    let gaps = included.saturating_sub(1) <= left;
    let mut out = Vec::with_capacity(height);
    for (i, s) in sections.iter().enumerate().take(included) {
        if i > 0 && gaps {
            out.push(String::new());
        }
        out.push(s.title.clone());
        let n = shown[i];
        if n < s.rows.len() && n > 1 {
            out.extend(s.rows[..n - 1].iter().cloned());
            out.push(format!("  … {} more", s.rows.len() - (n - 1)));
        } else {
            out.extend(s.rows[..n].iter().cloned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_cut_with_an_ellipsis_never_wrapped() {
        assert_eq!(fit("abcdef", 6), "abcdef");
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("é/dev/shm", 3), "é/…");
        assert_eq!(fit("x", 0), "");
        assert_eq!(pad("ab", 4), "ab  ");
        assert_eq!(pad("abcdef", 4), "abc…");
    }

    fn section(title: &str, n: usize) -> Section {
        Section {
            title: title.into(),
            rows: (0..n).map(|i| format!("{title} {i}")).collect(),
        }
    }

    #[test]
    fn sections_shrink_by_priority_and_never_overflow() {
        let s = [
            section("MOUNTS", 3),
            section("FAILURES", 5),
            section("PROCS", 14),
        ];
        for h in 0..40 {
            let lines = allot(&s, h);
            assert!(lines.len() <= h, "{h}: {lines:#?}");
        }
        // Room for all: everything, with gaps.
        let all = allot(&s, 40);
        assert_eq!(all.len(), 3 + 5 + 14 + 3 + 2);
        assert!(all.contains(&"PROCS 13".to_string()));
        // Tight: every section keeps its title and a row; the first keeps
        // all of its rows; the last is cut with a count.
        let tight = allot(&s, 14);
        assert_eq!(tight.len(), 14);
        assert!(tight.iter().any(|l| l == "MOUNTS 2"), "{tight:#?}");
        assert!(tight.iter().any(|l| l == "PROCS"), "{tight:#?}");
        assert_eq!(tight[13], "  … 12 more", "{tight:#?}");
        assert!(!tight.contains(&String::new()), "no gaps when tight");
        // Tighter still: the last sections go, the first stays.
        let tiny = allot(&s, 3);
        assert_eq!(tiny, ["MOUNTS", "MOUNTS 0", "  … 2 more"]);
        // One row left for a section: that row, no count (titles carry it).
        assert_eq!(allot(&s, 4)[..2], ["MOUNTS", "MOUNTS 0"]);
    }
}
