//! The job's segments as the diagnosis sizes them: how many processes make
//! them, and the largest one.

use super::scope::Scope;
use crate::state::failures::FailureKind;

/// Processes that created segments (files of 1 MiB or more) or failed.
pub fn workers_allocating(r: &Scope) -> u64 {
    let mut creators = r.segments.creators.clone();
    creators.extend(
        r.failures
            .iter()
            .filter(|f| f.kind != FailureKind::OomKill)
            .map(|f| f.pid),
    );
    creators.len() as u64
}

/// The largest segment: files seen over the run, failing files, requests.
pub fn largest_segment(r: &Scope) -> u64 {
    r.failures
        .iter()
        .filter_map(|f| f.file_size.map(|s| s.max(0) as u64))
        .chain(
            r.failures
                .iter()
                .filter(|f| f.kind != FailureKind::Sigbus)
                .filter_map(|f| f.bytes),
        )
        .chain(std::iter::once(r.segments.max_bytes))
        .max()
        .unwrap_or(0)
}
