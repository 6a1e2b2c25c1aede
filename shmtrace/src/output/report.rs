//! The JSON report (`--report FILE`): everything the summary says, and the
//! evidence behind it, for machines.

use anyhow::{Context, Result};

use crate::analysis::Report;

/// Writes atomically (temp file + rename): readers never see half a report.
pub fn write(r: &Report, path: &std::path::Path) -> Result<()> {
    let text = serde_json::to_string_pretty(r)?;
    let tmp = path.with_extension("tmp-shmtrace");
    std::fs::write(&tmp, text + "\n")
        .with_context(|| format!("cannot write report {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write report {}", path.display()))
}
