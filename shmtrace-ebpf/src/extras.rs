//! Programs that only `shmtrace doctor` loads, to learn whether this kernel
//! allows kprobes and fentry (optional extras; the capture never needs them).

use aya_ebpf::{
    macros::{fentry, kprobe},
    programs::{FEntryContext, ProbeContext},
};

#[fentry(function = "vfs_fallocate")]
pub fn doctor_fentry(_ctx: FEntryContext) -> u32 {
    0
}

#[kprobe]
pub fn doctor_kprobe(_ctx: ProbeContext) -> u32 {
    0
}
