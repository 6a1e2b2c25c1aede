//! Capture: from kernel hooks to typed events. `loader` checks privileges,
//! finds struct offsets (`btf`, `offsets`), loads and attaches the eBPF
//! programs and reads their rings; `decode` turns each record into a typed
//! [`crate::event::Event`]; `order` releases them in kernel-time order.

pub mod btf;
pub mod counters;
pub mod decode;
mod detach;
pub mod features;
pub mod hooks;
pub mod loader;
pub mod offsets;
pub mod order;
pub mod preflight;

pub use counters::{Counters, Losses, Suppressed};
pub use loader::{Tracer, monotonic_ns};
