//! Output: renders state and reports, decides nothing. The JSON report, the
//! human summary, the live view, Prometheus metrics, and the `--events`
//! stream.

pub mod events;
pub mod files;
pub mod live;
pub mod metrics;
pub mod report;
pub mod summary;
