//! Which programs attach where, and loading and attaching them: the
//! loader's table of hooks.

use anyhow::{Context, Result, anyhow};
use aya::{
    Ebpf,
    programs::{FExit, Program, ProgramError, RawTracePoint, TracePoint, UProbe},
};

/// One program and where it attaches.
pub struct Hook {
    pub prog: &'static str,
    pub kind: Kind,
    pub category: &'static str,
    /// Every hook point the program attaches to. A syscall family's names
    /// absent from tracefs (a syscall this architecture or kernel lacks)
    /// are skipped.
    pub names: &'static [&'static str],
    pub required: bool,
    /// What is lost without it.
    pub loses: &'static str,
    /// How the program reads a syscall's arguments, which decides the
    /// kernels it is for.
    pub args: Args,
}

/// A syscall exit program is built twice: with BTF-typed registers
/// (bpf_task_pt_regs, 5.15+) and, for older kernels, reading them from the
/// task's stack (split by syscall family, see shmtrace-ebpf/src/syscalls.rs).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Args {
    /// Reads no syscall arguments: every kernel.
    None,
    Btf,
    Stack,
}

impl Hook {
    /// Whether this hook's program is the one for `kernel`.
    pub fn fits(&self, kernel: &super::features::Kernel) -> bool {
        match self.args {
            Args::None => true,
            Args::Btf => kernel.task_pt_regs,
            Args::Stack => !kernel.task_pt_regs,
        }
    }
}

const fn tp(
    prog: &'static str,
    category: &'static str,
    names: &'static [&'static str],
    required: bool,
    loses: &'static str,
) -> Hook {
    Hook {
        prog,
        kind: Kind::Tp,
        category,
        names,
        required,
        loses,
        args: Args::None,
    }
}

/// A syscall exit hook (see [`Args`]).
const fn sys(
    prog: &'static str,
    args: Args,
    names: &'static [&'static str],
    required: bool,
    loses: &'static str,
) -> Hook {
    Hook {
        args,
        ..tp(prog, "syscalls", names, required, loses)
    }
}

const fn raw(prog: &'static str, name: &'static [&'static str], loses: &'static str) -> Hook {
    Hook {
        prog,
        kind: Kind::Raw,
        category: "",
        names: name,
        required: true,
        loses,
        args: Args::None,
    }
}

/// The hooks. Syscalls: classic per-syscall exit tracepoints of only the
/// calls that matter, so that every other syscall (read, futex, epoll...)
/// runs no program (see DESIGN.md, "Overhead"). close, dup, dup2, dup3,
/// fcntl and munmap are not hooked: every such call on the node would pay
/// the kernel's dispatch for the rare close, copy or unmap of a tmpfs file,
/// which user space's check of each tracked fd and mapping once a second
/// (and at a failure) sees.
/// The syscall exits of the write family whose tmpfs work goes through a
/// write_iter, and fallocate's beside them (one stack program takes all).
const WRITE_ITER_EXITS: &[&str] = &[
    "sys_exit_write",
    "sys_exit_pwrite64",
    "sys_exit_writev",
    "sys_exit_pwritev",
    "sys_exit_pwritev2",
    "sys_exit_sendfile64",
    "sys_exit_splice",
    "sys_exit_copy_file_range",
];
const WRITE_EXITS: &[&str] = &[
    "sys_exit_write",
    "sys_exit_pwrite64",
    "sys_exit_writev",
    "sys_exit_pwritev",
    "sys_exit_pwritev2",
    "sys_exit_sendfile64",
    "sys_exit_splice",
    "sys_exit_copy_file_range",
    "sys_exit_fallocate",
];
const OPEN_EXITS: &[&str] = &[
    "sys_exit_open",
    "sys_exit_openat",
    "sys_exit_openat2",
    "sys_exit_creat",
];

pub const HOOKS: &[Hook] = &[
    sys(
        "sys_exit_files",
        Args::Btf,
        &[
            "sys_exit_write",
            "sys_exit_pwrite64",
            "sys_exit_writev",
            "sys_exit_pwritev",
            "sys_exit_pwritev2",
            "sys_exit_fallocate",
            "sys_exit_sendfile64",
            "sys_exit_splice",
            "sys_exit_copy_file_range",
            "sys_exit_open",
            "sys_exit_openat",
            "sys_exit_openat2",
            "sys_exit_creat",
            "sys_exit_mmap",
            "sys_exit_mremap",
            "sys_exit_ftruncate",
        ],
        true,
        "ENOSPC/mmap failures of syscalls, tmpfs files created, mapped, moved and sized",
    ),
    sys(
        "sys_exit_writes_stack",
        Args::Stack,
        WRITE_EXITS,
        true,
        "ENOSPC failures of writes and fallocate",
    ),
    sys(
        "sys_exit_opens_stack",
        Args::Stack,
        OPEN_EXITS,
        true,
        "failed opens of /dev/shm files, tmpfs files created",
    ),
    sys(
        "sys_exit_mmap_stack",
        Args::Stack,
        &["sys_exit_mmap"],
        true,
        "mmap failures, tmpfs files mapped",
    ),
    sys(
        "sys_exit_mremap_stack",
        Args::Stack,
        &["sys_exit_mremap"],
        true,
        "mremap failures, tmpfs mappings moved",
    ),
    sys(
        "sys_exit_ftruncate_stack",
        Args::Stack,
        &["sys_exit_ftruncate"],
        true,
        "sizes of tmpfs files",
    ),
    sys(
        "sys_exit_recv",
        Args::Btf,
        &["sys_exit_recvmsg"],
        true,
        "tmpfs fds passed over unix sockets",
    ),
    sys(
        "sys_exit_recv_stack",
        Args::Stack,
        &["sys_exit_recvmsg"],
        true,
        "tmpfs fds passed over unix sockets",
    ),
    sys(
        "sys_exit_unlink",
        Args::Btf,
        &["sys_exit_unlink", "sys_exit_unlinkat"],
        false,
        "who removed a /dev/shm file (for opens that find it gone)",
    ),
    sys(
        "sys_exit_unlink_stack",
        Args::Stack,
        &["sys_exit_unlink", "sys_exit_unlinkat"],
        false,
        "who removed a /dev/shm file (for opens that find it gone)",
    ),
    raw(
        "signal_generate",
        &["signal_generate"],
        "SIGBUS from page faults",
    ),
    raw(
        "sched_process_fork",
        &["sched_process_fork"],
        "following new child processes",
    ),
    tp(
        "sched_process_exit",
        "sched",
        &["sched_process_exit"],
        true,
        "process exits",
    ),
    tp(
        "sched_process_exec",
        "sched",
        &["sched_process_exec"],
        false,
        "exec events (command lines)",
    ),
    tp(
        "signal_deliver",
        "signal",
        &["signal_deliver"],
        false,
        "whether a SIGBUS handler ran",
    ),
    tp(
        "oom_mark_victim",
        "oom",
        &["mark_victim"],
        false,
        "OOM kills of traced processes",
    ),
];

#[derive(Clone, Copy)]
pub enum Kind {
    Raw,
    Tp,
    FExit,
}

/// `--hooks`: which kernel hooks carry the syscall side of the capture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Backend {
    /// Trampolines per need where the kernel takes them, else tracepoints.
    #[default]
    Auto,
    Tracepoints,
    Trampolines,
}

static BACKEND: std::sync::OnceLock<Backend> = std::sync::OnceLock::new();

/// Set once from the command line, before any tracer starts.
pub fn choose_backend(b: Backend) {
    let _ = BACKEND.set(b);
}

pub fn backend() -> Backend {
    BACKEND.get().copied().unwrap_or_default()
}

/// One fexit program for one kernel function: the function, the parameter
/// count the program is written for (its return value is the argument
/// after the last), and the program in its two builds (see [`Args`]).
pub struct Fexit {
    pub function: &'static str,
    pub params: u32,
    pub prog: &'static str,
    pub stack_prog: &'static str,
}

const fn fx(
    function: &'static str,
    params: u32,
    prog: &'static str,
    stack_prog: &'static str,
) -> Fexit {
    Fexit {
        function,
        params,
        prog,
        stack_prog,
    }
}

/// One need of the capture a trampoline can meet: the functions that may
/// carry it, in order of preference, and the syscall tracepoints it stands
/// in for. A need with no function is one no tmpfs code sees: only the
/// tracepoints catch it, and `auto` does not attach them for it alone.
pub struct Trampoline {
    pub need: &'static str,
    pub functions: &'static [Fexit],
    pub replaces: &'static [&'static str],
    /// For a need with no function: why none can carry it.
    pub blind: &'static str,
}

/// Every syscall tracepoint's need, as a trampoline (see
/// shmtrace-ebpf/src/trampolines.rs and ../shared/reference/trampolines.md).
/// Only tmpfs's own functions (and tmpfs's lookup of a missing name): a
/// process that never touches tmpfs runs none of these programs, except
/// ftruncate and mremap, which few processes call.
pub const TRAMPOLINES: &[Trampoline] = &[
    Trampoline {
        need: "write ENOSPC",
        // tmpfs's own write_iter since 6.12; the generic one before (which
        // few other filesystems use).
        functions: &[
            fx("shmem_file_write_iter", 2, "fx_writes", "fx_writes_stack"),
            fx("generic_file_write_iter", 2, "fx_writes", "fx_writes_stack"),
        ],
        replaces: WRITE_ITER_EXITS,
        blind: "",
    },
    Trampoline {
        need: "fallocate ENOSPC",
        functions: &[fx(
            "shmem_fallocate",
            4,
            "fx_fallocate",
            "fx_fallocate_stack",
        )],
        replaces: &["sys_exit_fallocate"],
        blind: "",
    },
    Trampoline {
        need: "create (inode limit, tmpfs files created)",
        // 5.12 put the idmap (user namespace) first.
        functions: &[
            fx("shmem_create", 5, "fx_create", "fx_create_stack5"),
            fx("shmem_create", 4, "fx_create_stack", "fx_create_stack"),
        ],
        replaces: OPEN_EXITS,
        blind: "",
    },
    Trampoline {
        need: "open of a /dev/shm name that is gone (ENOENT)",
        functions: &[fx("simple_lookup", 3, "fx_lookup", "fx_lookup_stack")],
        replaces: OPEN_EXITS,
        blind: "",
    },
    Trampoline {
        need: "open at the fd limit (EMFILE, ENFILE)",
        functions: &[],
        replaces: OPEN_EXITS,
        blind: "the fd limit is hit before the path is looked up: no tmpfs code runs",
    },
    Trampoline {
        need: "mmap (tmpfs files mapped, RLIMIT_AS, noexec, placement errors)",
        functions: &[fx("shmem_get_unmapped_area", 5, "fx_mmap", "fx_mmap_stack")],
        replaces: &["sys_exit_mmap"],
        blind: "",
    },
    Trampoline {
        need: "mmap at vm.max_map_count",
        functions: &[],
        replaces: &["sys_exit_mmap"],
        blind: "the mapping count is tested before any tmpfs code runs",
    },
    Trampoline {
        need: "mremap",
        functions: &[fx("__x64_sys_mremap", 1, "fx_mremap", "fx_mremap_stack")],
        replaces: &["sys_exit_mremap"],
        blind: "",
    },
    Trampoline {
        need: "ftruncate (sizes)",
        functions: &[fx(
            "do_sys_ftruncate",
            3,
            "fx_ftruncate",
            "fx_ftruncate_stack",
        )],
        replaces: &["sys_exit_ftruncate"],
        blind: "",
    },
    Trampoline {
        need: "fds received over sockets",
        functions: &[fx("scm_detach_fds", 2, "fx_recv", "fx_recv_stack")],
        replaces: &["sys_exit_recvmsg"],
        blind: "",
    },
    Trampoline {
        need: "unlink",
        functions: &[fx("shmem_unlink", 2, "fx_unlink", "fx_unlink_stack")],
        replaces: &["sys_exit_unlink", "sys_exit_unlinkat"],
        blind: "",
    },
];

/// The syscall tracepoints no longer needed when the needs in `met` are
/// carried by trampolines: those every need that lists them is met for,
/// or is blind to trampolines (a blind need alone attaches nothing).
pub fn covered<'a>(met: impl Fn(&str) -> bool + 'a) -> std::collections::BTreeSet<&'static str> {
    let mut all: std::collections::BTreeSet<&'static str> = TRAMPOLINES
        .iter()
        .flat_map(|t| t.replaces.iter().copied())
        .collect();
    for t in TRAMPOLINES {
        if !t.functions.is_empty() && !met(t.need) {
            for n in t.replaces {
                all.remove(n);
            }
        }
    }
    all
}

/// How one need is met: by which backend and hook, and why not the other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NeedChoice {
    pub need: &'static str,
    /// "trampolines" or "tracepoints".
    pub backend: &'static str,
    /// fexit/FUNCTION, or the tracepoints.
    pub hook: String,
    /// Why the trampoline was not used (None where it was, or where
    /// --hooks tracepoints asked for none).
    pub fell_back: Option<String>,
}

/// (program, symbol): the CUDA IPC calls, runtime (libcudart) and driver
/// (libcuda).
pub const CUDA_PROBES: [(&str, &str); 4] = [
    ("cuda_ipc_get", "cudaIpcGetMemHandle"),
    ("cuda_ipc_open", "cudaIpcOpenMemHandle"),
    ("cu_ipc_get", "cuIpcGetMemHandle"),
    ("cu_ipc_open", "cuIpcOpenMemHandle"),
];

pub fn load_uprobe(ebpf: &mut Ebpf, prog: &str) -> Result<()> {
    let p: &mut UProbe = program(ebpf, prog)?.try_into()?;
    p.load().map_err(explain)
}

/// Why a syscall family's hook was skipped.
pub const ABSENT: &str = "no such syscall tracepoint on this kernel";

pub fn hook_name(kind: Kind, category: &str, name: &str) -> String {
    match kind {
        Kind::Raw => format!("raw_tp/{name}"),
        Kind::FExit => format!("fexit/{name}"),
        Kind::Tp => format!("tracepoint {category}:{name}"),
    }
}

pub fn explain(e: ProgramError) -> anyhow::Error {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            if let Some(why) = super::features::missing_helper(&log) {
                return anyhow!("{io_error}: {why}");
            }
            let tail: Vec<&str> = log.lines().rev().take(12).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            anyhow!("{io_error}; verifier said:\n{}", tail.join("\n"))
        }
        e => anyhow!(e),
    }
}

/// `prog` of the object, or why not.
pub fn program<'a>(ebpf: &'a mut Ebpf, prog: &str) -> Result<&'a mut Program> {
    ebpf.program_mut(prog)
        .with_context(|| format!("program {prog} is missing from the object"))
}

/// Loads (verifies) one program, once, whatever number of hooks it has.
pub fn load(ebpf: &mut Ebpf, prog: &str, kind: Kind) -> Result<()> {
    let p = program(ebpf, prog)?;
    match kind {
        Kind::Raw => {
            let p: &mut RawTracePoint = p.try_into()?;
            p.load().map_err(explain)?;
        }
        Kind::Tp => {
            let p: &mut TracePoint = p.try_into()?;
            p.load().map_err(explain)?;
        }
        Kind::FExit => unreachable!("trampolines load against a function: load_fexit"),
    }
    Ok(())
}

/// Loads fexit program `prog` against kernel function `function` and
/// attaches it.
pub fn attach_fexit(ebpf: &mut Ebpf, prog: &str, function: &str, btf: &aya::Btf) -> Result<()> {
    let p: &mut FExit = program(ebpf, prog)?.try_into()?;
    p.load(function, btf).map_err(explain)?;
    p.attach().map_err(explain)?;
    Ok(())
}

pub fn attach(ebpf: &mut Ebpf, prog: &str, kind: Kind, category: &str, name: &str) -> Result<()> {
    let p = program(ebpf, prog)?;
    match kind {
        Kind::Raw => {
            let p: &mut RawTracePoint = p.try_into()?;
            p.attach(name).map_err(explain)?;
        }
        Kind::Tp => {
            let p: &mut TracePoint = p.try_into()?;
            p.attach(category, name).map_err(explain)?;
        }
        Kind::FExit => unreachable!("see attach_fexit"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_program_appears_once_and_syscall_hooks_are_exits() {
        let mut seen = std::collections::BTreeSet::new();
        for h in HOOKS {
            assert!(seen.insert(h.prog), "{} twice", h.prog);
            assert!(!h.names.is_empty() && !h.loses.is_empty(), "{}", h.prog);
            if h.category == "syscalls" {
                // Only exits: the return value is the first test.
                assert!(
                    h.names.iter().all(|n| n.starts_with("sys_exit_")),
                    "{}",
                    h.prog
                );
            }
        }
        // read, futex, epoll_wait run no program; nor do close, fcntl,
        // dup and munmap (user space checks what it tracks instead).
        let all: Vec<&str> = HOOKS.iter().flat_map(|h| h.names.iter().copied()).collect();
        for quiet in [
            "sys_exit_read",
            "sys_exit_futex",
            "sys_exit_epoll_wait",
            "sys_exit_close",
            "sys_exit_fcntl",
            "sys_exit_dup",
            "sys_exit_munmap",
        ] {
            assert!(!all.contains(&quiet), "{quiet} is hooked");
        }
    }

    #[test]
    fn both_argument_variants_attach_the_same_tracepoints() {
        let set = |task_pt_regs| {
            let k = crate::capture::features::Kernel::new("x".into(), task_pt_regs);
            let mut v: Vec<&str> = HOOKS
                .iter()
                .filter(|h| h.fits(&k))
                .flat_map(|h| h.names.iter().copied())
                .collect();
            let n = v.len();
            v.sort();
            v.dedup();
            assert_eq!(v.len(), n, "a tracepoint twice");
            v
        };
        assert_eq!(set(true), set(false));
        // Only syscall hooks come in two variants.
        for h in HOOKS.iter().filter(|h| h.args != Args::None) {
            assert_eq!(h.category, "syscalls", "{}", h.prog);
        }
    }

    #[test]
    fn trampolines_stand_in_for_every_syscall_tracepoint() {
        let mut replaced: Vec<&str> = TRAMPOLINES
            .iter()
            .flat_map(|t| t.replaces.iter().copied())
            .collect();
        replaced.sort();
        replaced.dedup();
        let mut syscalls: Vec<&str> = HOOKS
            .iter()
            .filter(|h| h.args == Args::Btf)
            .flat_map(|h| h.names.iter().copied())
            .collect();
        syscalls.sort();
        assert_eq!(
            replaced, syscalls,
            "with every need met, no syscall tracepoint is left"
        );
        assert_eq!(covered(|_| true).into_iter().collect::<Vec<_>>(), syscalls);
        for t in TRAMPOLINES {
            // x86_64 trampolines take at most 6 arguments before 6.6.
            assert!(t.functions.iter().all(|f| f.params <= 6), "{}", t.need);
            assert_eq!(t.functions.is_empty(), !t.blind.is_empty(), "{}", t.need);
        }
    }

    #[test]
    fn a_need_left_to_tracepoints_keeps_every_tracepoint_it_shares() {
        // The create need fell back: the open exits stay, whatever the
        // lookup need did; the mmap exit goes.
        let c = covered(|n| !n.starts_with("create"));
        for n in OPEN_EXITS {
            assert!(!c.contains(n), "{n}");
        }
        assert!(c.contains("sys_exit_mmap"));
        assert!(c.contains("sys_exit_fallocate"));
        // Nothing met: nothing covered, blind needs included.
        assert!(covered(|_| false).is_empty());
    }

    #[test]
    fn cuda_probes_cover_runtime_and_driver_calls() {
        let symbols: Vec<&str> = CUDA_PROBES.iter().map(|(_, s)| *s).collect();
        assert_eq!(
            symbols,
            [
                "cudaIpcGetMemHandle",
                "cudaIpcOpenMemHandle",
                "cuIpcGetMemHandle",
                "cuIpcOpenMemHandle"
            ]
        );
        assert_eq!(
            hook_name(Kind::Raw, "", "signal_generate"),
            "raw_tp/signal_generate"
        );
        assert_eq!(
            hook_name(Kind::Tp, "oom", "mark_victim"),
            "tracepoint oom:mark_victim"
        );
    }
}
