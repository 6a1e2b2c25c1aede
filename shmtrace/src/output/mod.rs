//! Output: renders state and reports, decides nothing. The JSON report, the
//! human summary, the live view, Prometheus metrics (and `serve`, their
//! HTTP endpoint), and the `--events` stream.

pub mod events;
pub mod files;
pub mod filter;
pub mod fit;
pub mod incidents;
pub mod live;
pub mod metrics;
pub mod report;
#[cfg(test)]
mod schema_tests;
pub mod serve;
pub mod summary;
