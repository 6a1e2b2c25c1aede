//! The JSON report (`--report FILE`): everything the summary says, and the
//! evidence behind it, for machines.

use anyhow::{Context, Result};
use serde::Serialize;

/// Writes atomically and safely (see `files`): readers never see half a
/// report, and no planted name redirects it.
pub fn write(r: &impl Serialize, path: &std::path::Path) -> Result<()> {
    let text = serde_json::to_string_pretty(r)? + "\n";
    super::files::write_atomic(path, text.as_bytes())
        .with_context(|| format!("cannot write report {}", path.display()))
}

/// Says where the report could not go, after the summary: the diagnosis
/// is on the terminal, the job's status unchanged.
pub fn say_unwritten(path: &std::path::Path, e: &anyhow::Error) {
    eprintln!(
        "shmtrace: error: the report was NOT written to {}: {e:#}\n  the summary above is the whole diagnosis; rerun with --report in a writable place for the evidence",
        crate::escape::str(&path.display().to_string())
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_report_is_written_whole_and_an_unwritable_place_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        super::write(&serde_json::json!({"schema": 1, "name": "a\nb"}), &path).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v["name"], "a\nb");
        let e =
            super::write(&serde_json::json!({}), &dir.path().join("no/such/r.json")).unwrap_err();
        assert!(format!("{e:#}").contains("cannot write report"), "{e:#}");
    }
}
