//! shmtrace's eBPF programs: stable tracepoints only (no kprobe/fentry), each
//! filtering to traced processes and tmpfs files before it touches a map.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod emit;
#[cfg(target_arch = "bpf")]
mod extras;
#[cfg(target_arch = "bpf")]
mod kernel;
#[cfg(target_arch = "bpf")]
mod probes;

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(all(target_arch = "bpf", not(test)))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
