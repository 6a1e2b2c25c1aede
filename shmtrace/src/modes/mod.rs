//! Modes: how processes are picked and when tracing stops. Each wires
//! capture, state, analysis and output together through a `Session`.

mod cuda;
pub mod demo;
pub mod doctor;
pub mod node;
pub mod pid;
pub mod run;
pub mod session;
