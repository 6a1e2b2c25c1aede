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
