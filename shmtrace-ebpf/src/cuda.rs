//! CUDA IPC calls that failed: uretprobes on cudaIpcGetMemHandle and
//! cudaIpcOpenMemHandle (libcudart) and cuIpcGetMemHandle and
//! cuIpcOpenMemHandle (libcuda), attached by user space to each copy of the
//! library a traced process maps. Their errors are GPU memory or IPC
//! limits, which PyTorch reports in words that sound like /dev/shm.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::uretprobe, programs::RetProbeContext};
use shmtrace_common::{EventKind, cuda};

use crate::emit;

#[uretprobe]
pub fn cuda_ipc_get(ctx: RetProbeContext) -> u32 {
    returned(&ctx, cuda::GET_MEM_HANDLE)
}

#[uretprobe]
pub fn cuda_ipc_open(ctx: RetProbeContext) -> u32 {
    returned(&ctx, cuda::OPEN_MEM_HANDLE)
}

#[uretprobe]
pub fn cu_ipc_get(ctx: RetProbeContext) -> u32 {
    returned(&ctx, cuda::DRIVER_GET_MEM_HANDLE)
}

#[uretprobe]
pub fn cu_ipc_open(ctx: RetProbeContext) -> u32 {
    returned(&ctx, cuda::DRIVER_OPEN_MEM_HANDLE)
}

/// Early exits: success (0 is cudaSuccess and CUDA_SUCCESS), then an
/// untraced process.
#[inline(always)]
fn returned(ctx: &RetProbeContext, call: u64) -> u32 {
    // cudaError_t and CUresult are C enums: an int in the return register.
    let code = ctx.ret::<u64>() as u32 as i32;
    if code == 0 {
        return 0;
    }
    let ts = emit::now();
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !emit::is_traced(tgid) {
        return 0;
    }
    if let Some(mut e) = emit::start_failure(EventKind::CudaIpc, tgid, 0, ts) {
        let ev = emit::body(&mut e);
        ev.ret = code as i64;
        ev.args[0] = call;
        emit::submit_now(e);
    }
    0
}
