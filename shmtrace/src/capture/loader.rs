//! Loads the eBPF object embedded in this binary, attaches its programs, and
//! reads their two ring buffers in kernel-time order.

use anyhow::{Context, Result, anyhow};
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::{FEntry, KProbe, ProgramError, UProbe, uprobe::UProbeScope},
};
use shmtrace_common::{Budget, Config, lost};

use super::counters::{Counters, Losses, Suppressed};
use tokio::io::unix::AsyncFd;

use super::{
    btf::Btf,
    decode::Decoder,
    features,
    hooks::{
        ABSENT, Args, Backend, CUDA_PROBES, HOOKS, Kind, NeedChoice, TRAMPOLINES, attach,
        attach_fexit, hook_name, load, load_uprobe, program,
    },
    offsets,
    order::Orderer,
    preflight,
};
use crate::event::Event;

pub struct Tracer {
    _ebpf: Ebpf,
    traced: HashMap<MapData, u32, u32>,
    shm_mapped: HashMap<MapData, u32, u64>,
    /// Mount namespaces user space has anchored (see emit::submit_quiet).
    known_ns: HashMap<MapData, u32, u8>,
    known_ns_set: std::collections::BTreeSet<u32>,
    lost: PerCpuArray<MapData, u64>,
    fail_rate: HashMap<MapData, u32, Budget>,
    sent_rate: HashMap<MapData, u32, Budget>,
    events: AsyncFd<RingBuf<MapData>>,
    failures: AsyncFd<RingBuf<MapData>>,
    /// First failures on a mount, when FAILURES was full.
    firsts: AsyncFd<RingBuf<MapData>>,
    decoder: Decoder,
    /// Events read but not yet old enough to be sure nothing earlier is
    /// still on its way (two rings, several CPUs).
    order: Orderer,
    /// Records that did not decode (a version mismatch; never expected).
    pub undecodable: u64,
    /// Things the user should know (a hook the kernel refused, tracefs mounted...).
    pub notes: Vec<String>,
    /// Each hook and whether the kernel took it (None) or why not.
    pub hooks: Vec<(String, Option<String>)>,
    /// Which backend meets each need of the syscall side, and why a need
    /// fell back to its tracepoints.
    pub needs: Vec<NeedChoice>,
    /// The CUDA IPC uretprobes loaded, and the library files (dev, inode)
    /// they are attached to.
    cuda_ready: bool,
    cuda_attached: std::collections::HashSet<(u64, u64)>,
    /// Last field, so dropped last: closing it lets the holder that
    /// [`super::detach::hand_off`] forked exit with the last references.
    handoff: Option<std::os::fd::OwnedFd>,
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.handoff = super::detach::hand_off();
    }
}

impl Tracer {
    /// Everything from privilege checks to attached programs. Must be called
    /// inside a tokio runtime.
    pub fn start(all_processes: bool, events_ring: Option<u32>) -> Result<Self> {
        Self::start_with(all_processes, events_ring, |_| true)
    }

    /// Like [`Tracer::start`], attaching only the programs `want` accepts
    /// (tests load one program at a time).
    pub fn start_with(
        all_processes: bool,
        events_ring: Option<u32>,
        want: impl Fn(&str) -> bool,
    ) -> Result<Self> {
        preflight::check_privileges()?;
        preflight::check_btf()?;
        let (tracefs, mounted) = preflight::ensure_tracefs()?;
        let mut notes = Vec::new();
        let pids = preflight::PidView::detect();
        notes.extend(pids.note());
        if mounted {
            notes.push(format!(
                "mounted tracefs at {} (it was not mounted)",
                tracefs.display()
            ));
        }
        let btf = Btf::from_sys()?;
        let mut kernel = features::Kernel::detect(&btf);
        notes.extend(features::raise_memlock(&kernel));
        if !kernel.task_pt_regs {
            notes.push(format!(
                "kernel {}: syscall arguments read from each task's kernel stack (no \
                 bpf_task_pt_regs, which kernels from 5.15 on have, or SHMTRACE_SYSCALL_ARGS=stack)",
                kernel.release
            ));
        }
        let (offs, off_notes) = offsets::kernel_offsets(&btf, &tracefs)?;
        notes.extend(off_notes);
        let nrs = offsets::syscall_nrs();
        let config = Config {
            all_processes: all_processes as u32,
            self_tgid: pids.self_tgid(),
        };

        let mut loader = EbpfLoader::new();
        if let Some(bytes) = events_ring {
            loader.map_max_entries("EVENTS", bytes);
        }
        let mut ebpf = loader
            .override_global("OFFSETS", &offs, true)
            .override_global("NRS", &nrs, true)
            .override_global("CONFIG", &config, true)
            .load(aya::include_bytes_aligned!(concat!(
                env!("OUT_DIR"),
                "/shmtrace"
            )))
            .map_err(|e| {
                let admin = super::preflight::has_cap(super::preflight::effective_caps(), 21);
                let hint = if !admin && format!("{e:?}").contains("Operation not permitted") {
                    ": the kernel refused without CAP_SYS_ADMIN (CAP_BPF alone is not enough \
                     here, as in a container with --cap-add BPF): add SYS_ADMIN, as the \
                     DaemonSet manifest does"
                } else {
                    ""
                };
                anyhow::Error::new(e).context(format!(
                    "cannot load shmtrace's eBPF object into the kernel{hint}"
                ))
            })?;

        let mut hooks = Vec::new();
        let needs = trampolines(&mut ebpf, &btf, &kernel, &want, &mut hooks)?;
        let on_trampolines: Vec<&str> = needs
            .iter()
            .filter(|n| n.backend == "trampolines")
            .map(|n| n.need)
            .collect();
        let covered = super::hooks::covered(|n| on_trampolines.contains(&n));
        notes.extend(needs_notes(&needs));
        // Some verifiers (6.1's) give up on the one program that serves
        // every syscall exit (its 1M-instruction budget): the per-family
        // programs made for kernels before 5.15 pass them and read the same
        // arguments from the task's kernel stack. Tried before any attach,
        // so a refusal switches every syscall hook at once.
        let mut preloaded = Vec::new();
        for h in HOOKS.iter().filter(|h| {
            h.args == Args::Btf
                && want(h.prog)
                && h.fits(&kernel)
                && !h.names.iter().all(|n| covered.contains(n))
        }) {
            if let Err(e) = load(&mut ebpf, h.prog, h.kind) {
                let e = format!("{e:#}");
                notes.push(format!(
                    "kernel {}: its verifier refused {} ({}); syscall arguments read from \
                     each task's kernel stack instead, one program per syscall family",
                    kernel.release,
                    h.prog,
                    e.lines().next().unwrap_or_default()
                ));
                kernel.task_pt_regs = false;
                break;
            }
            preloaded.push(h.prog);
        }
        for h in HOOKS {
            if !want(h.prog) || !h.fits(&kernel) {
                continue;
            }
            if h.category == "syscalls" && h.names.iter().all(|n| covered.contains(n)) {
                continue;
            }
            let prog = h.prog;
            let loaded = if preloaded.contains(&prog) {
                Ok(())
            } else {
                load(&mut ebpf, prog, h.kind)
            };
            for &name in h.names {
                if covered.contains(name) {
                    continue;
                }
                let res = loaded
                    .as_ref()
                    .map_err(|e| anyhow!("{e:#}"))
                    .and_then(|()| {
                        if h.category == "syscalls"
                            && !tracefs.join("events/syscalls").join(name).exists()
                        {
                            return Err(anyhow!(ABSENT));
                        }
                        attach(&mut ebpf, prog, h.kind, h.category, name)
                    });
                let label = hook_name(h.kind, h.category, name);
                match &res {
                    Err(e) if h.category == "syscalls" && e.to_string() == ABSENT => {
                        // This architecture or kernel has no such syscall.
                        hooks.push((label, Some(ABSENT.to_string())));
                        continue;
                    }
                    _ => hooks.push((label.clone(), res.as_ref().err().map(|e| format!("{e:#}")))),
                }
                match res {
                    Ok(()) => {}
                    Err(e) if !h.required => notes.push(format!(
                        "the kernel refused hook {label} ({e}); shmtrace goes on without {}",
                        h.loses
                    )),
                    Err(e) => {
                        return Err(e.context(format!(
                            "the kernel refused hook {label}, which shmtrace needs for {}",
                            h.loses
                        )));
                    }
                }
            }
        }

        // CUDA IPC uretprobes: verified now, attached to each CUDA library
        // a traced process maps (`attach_cuda`).
        let mut cuda_ready = false;
        if want("cuda") {
            match CUDA_PROBES
                .iter()
                .try_for_each(|(prog, _)| load_uprobe(&mut ebpf, prog))
            {
                Ok(()) => cuda_ready = true,
                Err(e) => notes.push(format!(
                    "the kernel refused the CUDA IPC uprobes ({e:#}); shmtrace goes on without CUDA IPC errors"
                )),
            }
        }

        let traced = HashMap::try_from(ebpf.take_map("TRACED").context("map TRACED")?)?;
        let shm_mapped = HashMap::try_from(ebpf.take_map("SHM_MAPPED").context("map SHM_MAPPED")?)?;
        let known_ns = HashMap::try_from(ebpf.take_map("KNOWN_NS").context("map KNOWN_NS")?)?;
        let lost = PerCpuArray::try_from(ebpf.take_map("LOST").context("map LOST")?)?;
        let events = readable(RingBuf::try_from(
            ebpf.take_map("EVENTS").context("map EVENTS")?,
        )?)?;
        let failures = readable(RingBuf::try_from(
            ebpf.take_map("FAILURES").context("map FAILURES")?,
        )?)?;
        let firsts = readable(RingBuf::try_from(
            ebpf.take_map("FIRSTS").context("map FIRSTS")?,
        )?)?;
        let fail_rate = HashMap::try_from(ebpf.take_map("FAIL_RATE").context("map FAIL_RATE")?)?;
        let sent_rate = HashMap::try_from(ebpf.take_map("SENT_RATE").context("map SENT_RATE")?)?;
        Ok(Self {
            _ebpf: ebpf,
            traced,
            shm_mapped,
            known_ns,
            known_ns_set: Default::default(),
            lost,
            fail_rate,
            sent_rate,
            events,
            failures,
            firsts,
            decoder: Decoder::new(nrs),
            order: Orderer::default(),
            undecodable: 0,
            notes,
            hooks,
            needs,
            cuda_ready,
            cuda_attached: std::collections::HashSet::new(),
            handoff: None,
        })
    }

    /// Attaches the CUDA IPC uretprobes to the CUDA library mapped at
    /// `path` (a /proc/PID/map_files link: the very file, whatever the
    /// process's mount namespace; no path it controls is followed). `file`
    /// is its (dev, inode): each library file once. Returns whether
    /// anything was attached.
    pub fn attach_cuda(
        &mut self,
        path: &std::path::Path,
        name: &str,
        file: (u64, u64),
    ) -> Result<bool> {
        if !self.cuda_ready || self.cuda_attached.contains(&file) || self.cuda_attached.len() >= 64
        {
            return Ok(false);
        }
        let driver = name.starts_with("libcuda.so");
        let mut any = false;
        for (prog, symbol) in CUDA_PROBES {
            if symbol.starts_with("cuIpc") != driver {
                continue;
            }
            let p: &mut UProbe = program(&mut self._ebpf, prog)?.try_into()?;
            p.attach(symbol, path, UProbeScope::AllProcesses)
                .with_context(|| format!("uretprobe {symbol} in {name}"))?;
            any = true;
        }
        self.cuda_attached.insert(file);
        Ok(any)
    }

    /// Whether this kernel lets kprobes and fentry programs in: shmtrace
    /// does not need them, but `doctor` says what the node allows.
    pub fn probe_extras(&mut self) -> (Result<()>, Result<()>) {
        let kprobe = (|| -> Result<()> {
            if !std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists() {
                anyhow::bail!(
                    "no kprobe PMU in /sys/bus/event_source/devices (CONFIG_KPROBES off)"
                );
            }
            let p: &mut KProbe = self
                ._ebpf
                .program_mut("doctor_kprobe")
                .context("doctor_kprobe")?
                .try_into()?;
            p.load()?;
            p.attach("vfs_fallocate", 0)?;
            Ok(())
        })();
        let fentry = (|| -> Result<()> {
            let btf = aya::Btf::from_sys_fs()?;
            let p: &mut FEntry = self
                ._ebpf
                .program_mut("doctor_fentry")
                .context("doctor_fentry")?
                .try_into()?;
            p.load("vfs_fallocate", &btf).map_err(|e| match e {
                ProgramError::LoadError { io_error, .. } => anyhow!("load refused: {io_error}"),
                e => anyhow!(e),
            })?;
            p.attach()?;
            Ok(())
        })();
        (kprobe, fentry)
    }

    /// Adds `pid` to the traced set with `traced::*` flags.
    pub fn trace(&mut self, pid: u32, flags: u32) -> Result<()> {
        self.traced
            .insert(pid, flags, 0)
            .map_err(|e| anyhow!("cannot trace pid {pid}: {e}"))
    }

    pub fn untrace(&mut self, pid: u32) {
        let _ = self.traced.remove(&pid);
    }

    /// Marks a process that already has tmpfs mappings (found in /proc).
    pub fn mark_shm_mapped(&mut self, pid: u32) {
        // Superblock unknown (0): unmaps are followed, usage at a fault is not.
        let _ = self.shm_mapped.insert(pid, 0, 0);
    }

    /// Mount namespaces whose mounts user space knows: their processes'
    /// fork, exec and exit need not wake it (a new namespace's do, so that
    /// it is anchored while a process of it lives). Namespaces let go stay
    /// (the map is bounded; a stale entry only delays a wakeup).
    pub fn mark_known_namespaces(&mut self, nss: &[u32]) {
        for &ns in nss {
            if self.known_ns_set.insert(ns) {
                let _ = self.known_ns.insert(ns, 1, 0);
            }
        }
    }

    /// What the kernel side lost and held back, summed over CPUs, with the
    /// processes held back most (reads two bounded maps: not per event).
    pub fn counters(&self) -> Counters {
        let mut c = [0u64; lost::COUNT as usize];
        for (i, o) in c.iter_mut().enumerate() {
            if let Ok(v) = self.lost.get(&(i as u32), 0) {
                *o = v.iter().sum();
            }
        }
        let held = |m: &HashMap<MapData, u32, Budget>| -> Vec<(u32, u64)> {
            m.iter()
                .flatten()
                .filter(|(_, b)| b.suppressed > 0)
                .map(|(pid, b)| (pid, b.suppressed))
                .collect()
        };
        Counters {
            hooks: self.needs.iter().map(|n| (n.need, n.backend)).collect(),
            lost: Losses {
                events_ring: c[lost::EVENT as usize],
                failures_ring: c[lost::FAILURE as usize],
                traced_map_full: c[lost::TRACED_FULL as usize],
                first_failure_reserve_full: c[lost::FIRST as usize],
            },
            suppressed: Suppressed {
                failure_records: c[lost::RATE_LIMITED as usize],
                sent_sigbus: c[lost::SENT_SIGBUS as usize],
                by_process: Suppressed::top(held(&self.fail_rate), held(&self.sent_rate)),
            },
        }
    }

    /// Records that never reached user space (cheap: for live views).
    pub fn lost_total(&self) -> u64 {
        let mut n = 0;
        for i in [lost::EVENT, lost::FAILURE, lost::TRACED_FULL] {
            if let Ok(v) = self.lost.get(&i, 0) {
                n += v.iter().sum::<u64>();
            }
        }
        n
    }

    /// Waits until a ring has data or `timeout` passes.
    pub async fn wait(&mut self, timeout: std::time::Duration) {
        tokio::select! {
            r = self.events.readable_mut() => { if let Ok(mut g) = r { g.clear_ready(); } }
            r = self.failures.readable_mut() => { if let Ok(mut g) = r { g.clear_ready(); } }
            r = self.firsts.readable_mut() => { if let Ok(mut g) = r { g.clear_ready(); } }
            _ = tokio::time::sleep(timeout) => {}
        }
    }

    /// Reads both rings and returns, decoded and in kernel-time order,
    /// every event older than the moment the read began (so none can still
    /// be in flight before it). `flush` returns everything.
    pub fn drain(&mut self, flush: bool) -> Vec<Event> {
        let watermark = monotonic_ns();
        for ring in [
            self.firsts.get_mut(),
            self.failures.get_mut(),
            self.events.get_mut(),
        ] {
            while let Some(item) = ring.next() {
                match self.decoder.decode(&item) {
                    Ok(ev) => self.order.push(ev),
                    Err(_) => self.undecodable += 1,
                }
            }
        }
        self.order.release((!flush).then_some(watermark))
    }
}

/// Meets each need it can with a trampoline (`--hooks auto` or
/// `trampolines`), recording each fexit hook in `hooks`; returns how every
/// need is met. With `--hooks trampolines`, a need no trampoline meets is
/// an error that says why.
fn trampolines(
    ebpf: &mut Ebpf,
    btf: &Btf,
    kernel: &features::Kernel,
    want: &impl Fn(&str) -> bool,
    hooks: &mut Vec<(String, Option<String>)>,
) -> Result<Vec<NeedChoice>> {
    let backend = super::hooks::backend();
    let tracepoints = |t: &super::hooks::Trampoline, why: Option<String>| NeedChoice {
        need: t.need,
        backend: "tracepoints",
        hook: t
            .replaces
            .iter()
            .map(|n| format!("syscalls:{n}"))
            .collect::<Vec<_>>()
            .join(", "),
        fell_back: why,
    };
    let mut out = Vec::new();
    if backend == Backend::Tracepoints {
        for t in TRAMPOLINES {
            out.push(tracepoints(t, None));
        }
        return Ok(out);
    }
    let aya_btf = aya::Btf::from_sys_fs().map_err(|e| anyhow!("cannot read kernel BTF: {e}"));
    // A kernel that refuses fexit outright (EPERM, as this project's CI
    // machine's does) refuses every one: asked once.
    let mut refused: Option<String> = None;
    for t in TRAMPOLINES.iter().filter(|t| !t.functions.is_empty()) {
        let progs = |f: &super::hooks::Fexit| {
            if kernel.task_pt_regs {
                f.prog
            } else {
                f.stack_prog
            }
        };
        if !t.functions.iter().any(|f| want(progs(f))) {
            continue;
        }
        let mut why = Vec::new();
        let mut met = None;
        let mut absent: Vec<&str> = Vec::new();
        for f in t.functions {
            if let Some(r) = &refused {
                if !why.contains(r) {
                    why.push(r.clone());
                }
                break;
            }
            let name = f.function;
            if absent.contains(&name) {
                continue; // the same function for another parameter count
            }
            match btf.function_params(name) {
                None => {
                    why.push(format!(
                        "{name} is not in this kernel's BTF (renamed or inlined)"
                    ));
                    absent.push(name);
                }
                // Another entry may be written for this count.
                Some(n) if n != f.params => {
                    if !t
                        .functions
                        .iter()
                        .any(|g| g.function == name && g.params == n)
                    {
                        why.push(format!(
                            "{name} takes {n} parameters on this kernel, the program is \
                             written for {}",
                            f.params
                        ));
                    }
                }
                Some(_) => {
                    let res = aya_btf
                        .as_ref()
                        .map_err(|e| anyhow!("{e}"))
                        .and_then(|b| attach_fexit(ebpf, progs(f), name, b));
                    match res {
                        Ok(()) => {
                            met = Some(name);
                            break;
                        }
                        Err(e) => {
                            let e = format!("{e:#}");
                            if e.contains("Operation not permitted") {
                                let r = "this kernel refuses fexit programs (EPERM: no BPF \
                                         trampolines, ftrace's direct calls are off or blocked)"
                                    .to_string();
                                why.push(r.clone());
                                refused = Some(r);
                            } else {
                                // The verifier's log is for doctor, not one line.
                                let first = e.lines().next().unwrap_or_default();
                                why.push(format!("the kernel refused fexit/{name}: {first}"));
                            }
                        }
                    }
                }
            }
        }
        match met {
            Some(f) => {
                hooks.push((hook_name(Kind::FExit, "", f), None));
                out.push(NeedChoice {
                    need: t.need,
                    backend: "trampolines",
                    hook: format!("fexit/{f}"),
                    fell_back: None,
                });
            }
            None if backend == Backend::Trampolines => {
                bail_need(t.need, &why)?;
            }
            None => out.push(tracepoints(t, Some(why.join("; ")))),
        }
    }
    // What no tmpfs code sees: caught where the tracepoints it needs are
    // attached for another need anyway, else not at all.
    let on_trampolines: Vec<&str> = out
        .iter()
        .filter(|n| n.backend == "trampolines")
        .map(|n| n.need)
        .collect();
    let covered = super::hooks::covered(|n| on_trampolines.contains(&n));
    for t in TRAMPOLINES.iter().filter(|t| t.functions.is_empty()) {
        if t.replaces.iter().all(|n| !covered.contains(n)) {
            out.push(tracepoints(t, None));
        } else {
            out.push(NeedChoice {
                need: t.need,
                backend: "none",
                hook: "-".to_string(),
                fell_back: Some(format!(
                    "{}; --hooks tracepoints sees it, at the cost of every syscall's slow path",
                    t.blind
                )),
            });
        }
    }
    Ok(out)
}

fn bail_need(need: &str, why: &[String]) -> Result<()> {
    Err(anyhow!(
        "--hooks trampolines: no trampoline for {need} on this kernel ({}); \
         use --hooks auto to let its syscall tracepoints carry it",
        why.join("; ")
    ))
}

/// The notes of a start where trampolines carry some needs but not all, or
/// none on a kernel that refuses them; and of what trampolines leave unseen.
fn needs_notes(needs: &[NeedChoice]) -> Vec<String> {
    let mut notes = Vec::new();
    let fell: Vec<&NeedChoice> = needs
        .iter()
        .filter(|n| n.backend == "tracepoints" && n.fell_back.is_some())
        .collect();
    if !fell.is_empty() {
        let on = needs.iter().filter(|n| n.backend == "trampolines").count();
        let mut reasons: Vec<&str> = fell.iter().filter_map(|n| n.fell_back.as_deref()).collect();
        reasons.sort_unstable();
        reasons.dedup();
        let carried = if on == 0 {
            format!("all {} needs", needs.len())
        } else {
            let names: Vec<&str> = fell.iter().map(|n| n.need).collect();
            format!(
                "{} of {} needs ({})",
                fell.len(),
                needs.len(),
                names.join(", ")
            )
        };
        notes.push(format!(
            "hooks: syscall tracepoints carry {carried}, as {}: every syscall on the node takes \
             the kernel's slower path while they are attached (shmtrace doctor lists each need)",
            reasons.join("; ")
        ));
    }
    let blind: Vec<&str> = needs
        .iter()
        .filter(|n| n.backend == "none")
        .map(|n| n.need)
        .collect();
    if !blind.is_empty() {
        notes.push(format!(
            "hooks: trampolines carry every need but {}, which no tmpfs code sees (--hooks \
             tracepoints catches them, at the cost of every syscall's slow path)",
            blind.join(" and ")
        ));
    }
    notes
}

/// Registers a ring buffer with tokio for readiness.
fn readable(ring: RingBuf<MapData>) -> Result<AsyncFd<RingBuf<MapData>>> {
    // SAFETY: the ring buffer owns its fd and is dropped with the AsyncFd,
    // so the fd stays open for as long as it is registered.
    unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(|e| anyhow!("cannot poll a ring buffer: {}", e.into_parts().1))
}

/// CLOCK_MONOTONIC in ns: the clock bpf_ktime_get_ns reads.
pub fn monotonic_ns() -> u64 {
    let ts =
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}
