//! shmtrace's eBPF programs: stable tracepoints everywhere, and fexit
//! trampolines on tmpfs's work where the kernel takes them; each filters to
//! traced processes and tmpfs files before it touches a map.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

//!
//! One file per hook family: `sched` (fork, exec, exit), `signals` (SIGBUS
//! generated and delivered), `syscalls` (syscalls:sys_exit_* of the calls
//! that matter), `unlink` (removals of /dev/shm files), `sysexit` (what every syscall-exit program reads: the record, the argument registers), `oom` (mark_victim), `cuda` (uretprobes on CUDA IPC calls), `trampolines` (fexit on the kernel functions that do the syscalls' tmpfs work, the same handlers);
//! `emit` holds the maps and event headers, `kernel` the struct reads at
//! offsets user space found in BTF, `extras` what only `doctor` loads.

#[cfg(target_arch = "bpf")]
mod cuda;
#[cfg(target_arch = "bpf")]
mod emit;
#[cfg(target_arch = "bpf")]
mod extras;
#[cfg(target_arch = "bpf")]
mod kernel;
#[cfg(target_arch = "bpf")]
mod oom;
#[cfg(target_arch = "bpf")]
mod sched;
#[cfg(target_arch = "bpf")]
mod signals;
#[cfg(target_arch = "bpf")]
mod syscalls;
#[cfg(target_arch = "bpf")]
mod sysexit;
#[cfg(target_arch = "bpf")]
mod trampolines;
#[cfg(target_arch = "bpf")]
mod unlink;

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(all(target_arch = "bpf", not(test)))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// SAFETY (link_section, no_mangle): the kernel reads the license from
// this section by name; nothing else uses the symbol.
#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
