//! The numbers the eBPF programs need from this kernel: struct member offsets
//! (from BTF), classic tracepoint field offsets (from tracefs format files),
//! and syscall numbers (from this architecture's ABI).

use std::path::Path;

use anyhow::{Context, Result, bail};
use shmtrace_common::{KernelOffsets, SyscallNrs};

use super::btf::Btf;

const MISSING: u32 = KernelOffsets::MISSING;

/// Offsets for the running kernel. Fails only when a member the core
/// capture cannot do without is absent; optional ones become `MISSING`.
pub fn kernel_offsets(btf: &Btf, tracefs: &Path) -> Result<(KernelOffsets, Vec<String>)> {
    let mut notes = Vec::new();
    let mut missing_required = Vec::new();
    let mut get = |s: &str, m: &str, required: bool| -> u32 {
        match btf.offset(s, m) {
            Some(o) => o,
            None => {
                if required {
                    missing_required.push(format!("{s}.{m}"));
                } else {
                    notes.push(format!(
                        "kernel BTF has no {s}.{m}: that detail is left out"
                    ));
                }
                MISSING
            }
        }
    };
    let regs = ["di", "si", "dx", "r10", "r8", "r9"];
    let mut regs_args = [MISSING; 6];
    for (i, r) in regs.iter().enumerate() {
        regs_args[i] = get("pt_regs", r, true);
    }
    let mut o = KernelOffsets {
        task_pid: get("task_struct", "pid", true),
        task_tgid: get("task_struct", "tgid", true),
        task_real_parent: get("task_struct", "real_parent", false),
        task_files: get("task_struct", "files", true),
        task_nsproxy: get("task_struct", "nsproxy", false),
        task_exit_code: get("task_struct", "exit_code", false),
        files_fdt: get("files_struct", "fdt", true),
        fdt_max_fds: get("fdtable", "max_fds", true),
        fdt_fd: get("fdtable", "fd", true),
        file_inode: get("file", "f_inode", true),
        file_pos: get("file", "f_pos", false),
        file_dentry: get("file", "f_path.dentry", false),
        dentry_name: get("dentry", "d_name.name", false),
        dentry_parent: get("dentry", "d_parent", false),
        dentry_inode: get("dentry", "d_inode", false),
        inode_sb: get("inode", "i_sb", true),
        inode_ino: get("inode", "i_ino", true),
        inode_size: get("inode", "i_size", true),
        inode_nlink: get("inode", "__i_nlink", false),
        inode_blocks: get("inode", "i_blocks", false),
        sb_dev: get("super_block", "s_dev", true),
        sb_magic: get("super_block", "s_magic", true),
        sb_fs_info: get("super_block", "s_fs_info", false),
        sbinfo_max_blocks: get("shmem_sb_info", "max_blocks", false),
        sbinfo_used_blocks: get("shmem_sb_info", "used_blocks.count", false),
        nsproxy_mnt_ns: get("nsproxy", "mnt_ns", false),
        mnt_ns_inum: get("mnt_namespace", "ns.inum", false),
        regs_args,
        regs_nr: get("pt_regs", "orig_ax", true),
        task_stack: get("task_struct", "stack", false),
        regs_window: MISSING,
        stack_regs: match btf.size("pt_regs") {
            Some(size) => thread_size(btf) - size,
            None => MISSING,
        },
        tp_exec_filename: MISSING,
        tp_exec_old_pid: MISSING,
        tp_exit_group_dead: MISSING,
        tp_deliver_sig: MISSING,
        tp_deliver_code: MISSING,
        tp_deliver_handler: MISSING,
        tp_victim_pid: MISSING,
        tp_victim_shmem_rss: MISSING,
        task_signal: get("task_struct", "signal", false),
        signal_rlim: get("signal_struct", "rlim", false),
        task_mm: get("task_struct", "mm", false),
        mm_total_vm: get("mm_struct", "total_vm", false),
        mm_map_count: get("mm_struct", "map_count", false),
        file_mnt: get("file", "f_path.mnt", false),
        vfsmount_flags: get("vfsmount", "mnt_flags", false),
        mount_mnt: get("mount", "mnt", false),
        mount_parent: get("mount", "mnt_parent", false),
        mount_mountpoint: get("mount", "mnt_mountpoint", false),
        vfsmount_root: get("vfsmount", "mnt_root", false),
        task_group_leader: get("task_struct", "group_leader", false),
        task_thread_pid: get("task_struct", "thread_pid", false),
        pid_level: get("pid", "level", false),
        pid_numbers: get("pid", "numbers", false),
        // struct upid { int nr; struct pid_namespace *ns; }: ns is last.
        upid_size: match get("upid", "ns", false) {
            MISSING => MISSING,
            ns => ns + 8,
        },
        task_cgroups: get("task_struct", "cgroups", false),
        css_set_memcg: MISSING,
        css_cgroup: get("cgroup_subsys_state", "cgroup", false),
        cgroup_kn: get("cgroup", "kn", false),
        kn_id: get("kernfs_node", "id", false),
    };
    // Kernels before 5.15 read the argument registers and orig_ax in one
    // window (see KernelOffsets::regs_window).
    let words = o.regs_args.iter().chain([&o.regs_nr]);
    if let (Some(&lo), Some(&hi)) = (words.clone().min(), words.max())
        && hi != MISSING
        && (hi - lo) / 8 < shmtrace_common::REGS_WINDOW as u32
        && o.regs_args
            .iter()
            .chain([&o.regs_nr])
            .all(|w| (w - lo) % 8 == 0)
    {
        o.regs_window = lo;
    }
    // The memory controller's slot in css_set.subsys: its index is an enum
    // constant that depends on which controllers the kernel was built with.
    o.css_set_memcg = match (
        btf.enum_value("memory_cgrp_id"),
        get("css_set", "subsys", false),
    ) {
        (Some(i), subsys) if subsys != MISSING && (0..64).contains(&i) => subsys + 8 * i as u32,
        _ => {
            notes.push(
                "kernel BTF has no css_set.subsys or memory_cgrp_id (no memory \
                 controller): a process's memory cgroup is read from /proc only"
                    .into(),
            );
            MISSING
        }
    };
    if !missing_required.is_empty() {
        bail!(
            "this kernel's BTF lacks {} (shmtrace supports x86_64 kernels 5.10 and newer)",
            missing_required.join(", ")
        );
    }

    let exec = TpFormat::read(tracefs, "sched", "sched_process_exec")?;
    o.tp_exec_filename = exec
        .offset("filename")
        .context("sched_process_exec has no filename")?;
    o.tp_exec_old_pid = exec.offset("old_pid").unwrap_or(MISSING);
    let exit = TpFormat::read(tracefs, "sched", "sched_process_exit")?;
    o.tp_exit_group_dead = exit.offset("group_dead").unwrap_or(MISSING);
    let deliver = TpFormat::read(tracefs, "signal", "signal_deliver")?;
    o.tp_deliver_sig = deliver.offset("sig").context("signal_deliver has no sig")?;
    o.tp_deliver_code = deliver.offset("code").unwrap_or(MISSING);
    o.tp_deliver_handler = deliver.offset("sa_handler").unwrap_or(MISSING);
    // The syscall exit programs read nr and ret at fixed offsets.
    let sys_exit = TpFormat::read(tracefs, "syscalls", "sys_exit_openat")?;
    let layout = (sys_exit.offset("__syscall_nr"), sys_exit.offset("ret"));
    if layout != (Some(8), Some(16)) {
        bail!(
            "syscalls:sys_exit_openat has an unexpected layout (__syscall_nr, ret at {layout:?}, \
             not 8 and 16); shmtrace does not support this kernel"
        );
    }
    let victim = TpFormat::read(tracefs, "oom", "mark_victim")?;
    o.tp_victim_pid = victim.offset("pid").context("oom:mark_victim has no pid")?;
    o.tp_victim_shmem_rss = victim.offset("shmem_rss").unwrap_or(MISSING);
    Ok((o, notes))
}

/// x86_64's kernel stack size: 16 KiB, doubled by KASAN (whose checks BTF
/// then lists). Only kernels before 5.15 need it (see `task_stack`), and
/// the programs check the syscall number found there before trusting it.
fn thread_size(btf: &Btf) -> u32 {
    if btf.function_params("__kasan_check_read").is_some() {
        32 << 10
    } else {
        16 << 10
    }
}

/// Field offsets of one classic tracepoint, from its tracefs `format` file.
pub struct TpFormat {
    fields: Vec<(String, u32)>,
}

impl TpFormat {
    pub fn read(tracefs: &Path, category: &str, name: &str) -> Result<Self> {
        let path = tracefs
            .join("events")
            .join(category)
            .join(name)
            .join("format");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Ok(Self::parse(&text))
    }

    pub fn parse(text: &str) -> Self {
        let mut fields = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            let Some(rest) = line.strip_prefix("field:") else {
                continue;
            };
            let mut parts = rest.split(';');
            let decl = parts.next().unwrap_or("").trim();
            let name = decl.rsplit([' ', '*']).next().unwrap_or("");
            let name = name.split('[').next().unwrap_or("").to_string();
            let offset = parts
                .find_map(|p| p.trim().strip_prefix("offset:"))
                .and_then(|v| v.trim().parse().ok());
            if let Some(off) = offset {
                fields.push((name, off));
            }
        }
        Self { fields }
    }

    pub fn offset(&self, field: &str) -> Option<u32> {
        self.fields
            .iter()
            .find(|(n, _)| n == field)
            .map(|(_, o)| *o)
    }
}

pub fn syscall_nrs() -> SyscallNrs {
    let n = |v: libc::c_long| v as u32;
    SyscallNrs {
        write: n(libc::SYS_write),
        pwrite64: n(libc::SYS_pwrite64),
        writev: n(libc::SYS_writev),
        pwritev: n(libc::SYS_pwritev),
        pwritev2: n(libc::SYS_pwritev2),
        fallocate: n(libc::SYS_fallocate),
        ftruncate: n(libc::SYS_ftruncate),
        open: n(libc::SYS_open),
        openat: n(libc::SYS_openat),
        openat2: n(libc::SYS_openat2),
        creat: n(libc::SYS_creat),
        mmap: n(libc::SYS_mmap),
        mremap: n(libc::SYS_mremap),
        recvmsg: n(libc::SYS_recvmsg),
        sendfile: n(libc::SYS_sendfile),
        splice: n(libc::SYS_splice),
        copy_file_range: n(libc::SYS_copy_file_range),
        unlink: n(libc::SYS_unlink),
        unlinkat: n(libc::SYS_unlinkat),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tracefs_format() {
        let f = TpFormat::parse(
            "name: signal_deliver\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
             \tfield:int sig;\toffset:8;\tsize:4;\tsigned:1;\n\
             \tfield:char comm[16];\toffset:20;\tsize:16;\tsigned:0;\n\
             \tfield:__data_loc char[] filename;\toffset:8;\tsize:4;\tsigned:0;\n\
             \tfield:unsigned long sa_handler;\toffset:24;\tsize:8;\tsigned:0;\n",
        );
        assert_eq!(f.offset("sig"), Some(8));
        assert_eq!(f.offset("comm"), Some(20));
        assert_eq!(f.offset("filename"), Some(8));
        assert_eq!(f.offset("sa_handler"), Some(24));
        assert_eq!(f.offset("nope"), None);
    }
}
