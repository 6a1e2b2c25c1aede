//! Host-side stub: the programs live in the `shmtrace` binary target, built
//! for bpfel-unknown-none by shmtrace/build.rs. This empty library lets the
//! user-space crate name this one as a build dependency (so cargo rebuilds).
#![no_std]
