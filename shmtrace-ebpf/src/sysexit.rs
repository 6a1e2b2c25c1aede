//! What every syscalls:sys_exit_* program reads the same way: the record's
//! syscall number and return value, the task's saved argument registers,
//! and the one path test both the failure path and unlink make.

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task_btf, bpf_probe_read_user, bpf_task_pt_regs,
    },
    programs::TracePointContext,
};

use crate::kernel::off;

/// (syscall number, return value) from a syscalls:sys_exit_* record:
/// `int __syscall_nr` at 8 and `long ret` at 16, the same on every kernel
/// since syscall tracepoints exist (checked against tracefs by the loader).
#[inline(always)]
pub(crate) fn exit_record(ctx: &TracePointContext) -> (u32, i64) {
    let p = ctx.as_ptr() as *const u8;
    // SAFETY: direct loads from the tracepoint record, which the verifier
    // bounds-checks against the context size.
    unsafe { (*(p.add(8) as *const i32) as u32, *(p.add(16) as *const i64)) }
}

/// The current task's saved user registers: the syscall's arguments.
#[inline(always)]
pub(crate) fn user_regs() -> u64 {
    // SAFETY: helpers without side effects on the current task; the result
    // is a BTF-typed pointer to its pt_regs, loaded from in `arg`.
    unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) as u64 }
}

#[inline(always)]
pub(crate) fn arg(regs: u64, i: usize) -> u64 {
    let off = off!(regs_args[i]) as u64;
    // SAFETY: `regs` is the BTF-typed pt_regs from `user_regs`: the
    // verifier checks this load against the struct (the offset is a
    // constant of the read-only config), so no helper call is needed.
    unsafe { *((regs + off) as *const u64) }
}

#[inline(always)]
pub(crate) fn tgid() -> u32 {
    (bpf_get_current_pid_tgid() >> 32) as u32
}

/// Whether user string `p` starts with "/dev/shm/": one 9-byte read.
#[inline(always)]
pub(crate) fn is_shm_path(p: u64) -> bool {
    // SAFETY: a user pointer read with the checked helper; a bad pointer
    // (or a string shorter than 9 bytes at a page's end) is an error.
    match unsafe { bpf_probe_read_user(p as *const [u8; 9]) } {
        Ok(b) => &b == b"/dev/shm/",
        Err(_) => false,
    }
}
