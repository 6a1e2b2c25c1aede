//! What every syscalls:sys_exit_* program reads the same way: the record's
//! syscall number and return value, the syscall's arguments (two ways, one
//! per kernel generation), and the one path test both the failure path and
//! unlink make.

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task_btf, bpf_probe_read_user, bpf_task_pt_regs,
    },
    programs::TracePointContext,
};

use shmtrace_common::REGS_WINDOW;

use crate::kernel::{self, off};

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

/// The current task's saved user registers: a syscall's arguments. Each
/// exit program is built once per implementation and the loader picks the
/// one the running kernel takes (see capture/hooks.rs).
pub(crate) trait Regs: Copy {
    /// The registers of the syscall `nr` now returning, or None when they
    /// cannot be read.
    fn current(nr: u32) -> Option<Self>;
    /// The registers of whatever syscall the task is in, with its number
    /// (a trampoline program on a kernel function does not know which).
    fn current_any() -> Option<(Self, u32)>;
    /// Argument `i` (0-5) of the syscall.
    fn arg(self, i: usize) -> u64;
}

/// 5.15+: `bpf_task_pt_regs(bpf_get_current_task_btf())`, a BTF-typed
/// pointer the verifier lets the program load from directly.
#[derive(Clone, Copy)]
pub(crate) struct BtfRegs(u64);

impl Regs for BtfRegs {
    #[inline(always)]
    fn current(_nr: u32) -> Option<Self> {
        // SAFETY: helpers without side effects on the current task; the
        // result is a BTF-typed pointer to its pt_regs, loaded from in `arg`.
        Some(Self(unsafe {
            bpf_task_pt_regs(bpf_get_current_task_btf()) as u64
        }))
    }

    #[inline(always)]
    fn current_any() -> Option<(Self, u32)> {
        let regs = Self::current(0)?;
        let at = regs.0 + off!(regs_nr) as u64;
        // SAFETY: as in `arg`: a verifier-checked load from the BTF pt_regs.
        let nr = unsafe { *(at as *const u64) };
        Some((regs, nr as u32))
    }

    #[inline(always)]
    fn arg(self, i: usize) -> u64 {
        let off = off!(regs_args[i]) as u64;
        // SAFETY: `self.0` is the BTF-typed pt_regs from `current`: the
        // verifier checks this load against the struct (the offset is a
        // constant of the read-only config), so no helper call is needed.
        unsafe { *((self.0 + off) as *const u64) }
    }
}

/// Before 5.15 (5.10: no bpf_get_current_task_btf, no bpf_task_pt_regs):
/// x86_64 keeps a task's user registers at the top of its kernel stack,
/// `task->stack + THREAD_SIZE - sizeof(struct pt_regs)` (the loader finds
/// both sizes): the words holding the arguments and orig_ax are read in one
/// checked helper call, which keeps the verifier's work small. The saved syscall number
/// (orig_ax) must be the one returning, or nothing is trusted. Kernels
/// built with FRED (6.9+) keep 16 bytes of padding above the registers:
/// tried second, so that this variant is right wherever it is chosen.
#[derive(Clone, Copy)]
pub(crate) struct StackRegs([u64; REGS_WINDOW]);

impl Regs for StackRegs {
    #[inline(always)]
    fn current(nr: u32) -> Option<Self> {
        let stack = kernel::read_ptr(kernel::current_task(), off!(task_stack));
        let (top, base) = (off!(stack_regs), off!(regs_window));
        if stack == 0 || top == kernel::MISSING || base == kernel::MISSING {
            return None;
        }
        let nr_at = ((off!(regs_nr) - base) / 8) as usize;
        for pad in [0u64, 16] {
            let at = stack + top as u64 - pad + base as u64;
            if let Some(w) = kernel::read::<[u64; REGS_WINDOW]>(at, 0)
                && w.get(nr_at).is_some_and(|&orig| orig as u32 == nr)
            {
                return Some(Self(w));
            }
        }
        None
    }

    /// Only kernels without FRED take this variant, so no padding; a number
    /// past every syscall's is not a syscall's registers.
    #[inline(always)]
    fn current_any() -> Option<(Self, u32)> {
        let stack = kernel::read_ptr(kernel::current_task(), off!(task_stack));
        let (top, base) = (off!(stack_regs), off!(regs_window));
        if stack == 0 || top == kernel::MISSING || base == kernel::MISSING {
            return None;
        }
        let w = kernel::read::<[u64; REGS_WINDOW]>(stack + top as u64 + base as u64, 0)?;
        let nr = *w.get(((off!(regs_nr) - base) / 8) as usize)?;
        (nr < 1024).then_some((Self(w), nr as u32))
    }

    #[inline(always)]
    fn arg(self, i: usize) -> u64 {
        let at = ((off!(regs_args[i]) - off!(regs_window)) / 8) as usize;
        self.0.get(at).copied().unwrap_or(0)
    }
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
