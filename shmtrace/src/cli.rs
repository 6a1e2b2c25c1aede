//! Command line: what each mode is for, with examples in --help.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Args, Parser, Subcommand};

use crate::{
    Fail,
    modes::{
        node, pid,
        run::{self, RunOpts},
        session::Outputs,
    },
};

const ABOUT: &str =
    "Finds which process failed first when shared memory (/dev/shm) ran out, and why.";

const LONG_ABOUT: &str = "\
Finds which process failed first when shared memory (/dev/shm, tmpfs) ran out, and why.

PyTorch DataLoader workers pass every batch through /dev/shm; in a container
it is 64 MiB by default, and jobs die with 'DataLoader worker (pid N) is killed
by signal: Bus error' or 'unable to allocate shared memory(shm)'. The message
names whichever worker the framework happened to check. shmtrace watches the
kernel (eBPF on stable tracepoints) and reports the process that failed first,
what it was writing, how full the tmpfs was, who held the bytes, every later
failure, and the /dev/shm size that would have been enough.

Modes: `run -- CMD` traces a command from its start; `--pid PID` attaches to
a running job; with neither, shmtrace traces the whole node (every process,
attributed to its container) until Ctrl-C, with a live view.

Needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE).";

const EXAMPLES: &str = "\
Examples:
  sudo shmtrace                             node-wide: every process and container, live
  sudo shmtrace demo                        see a real failure diagnosed (no PyTorch needed)
  sudo shmtrace run -- python train.py      trace a job from its start; exits with its status
  sudo shmtrace run --shm-size 64M -- python train.py
                                            reproduce Docker's 64 MiB /dev/shm on any machine
  sudo shmtrace --pid 4242 --report r.json  attach to a running job and its workers";

#[derive(Parser, Debug)]
#[command(name = "shmtrace", version, about = ABOUT, long_about = LONG_ABOUT, after_help = EXAMPLES)]
pub struct Cli {
    /// Attach to this running process and all its descendants (present and
    /// future) until they have all exited, or Ctrl-C.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,

    #[command(flatten)]
    pub out: TraceArgs,

    #[command(flatten)]
    pub node: NodeArgs,

    /// Which kernel hooks carry the capture. auto: fexit trampolines on
    /// tmpfs's own functions where this kernel takes them (a process that
    /// never touches tmpfs then pays nothing), the syscall tracepoint per
    /// need where it does not; tracepoints: syscall exit tracepoints only
    /// (every syscall on the node takes the kernel's slower path while they
    /// are attached); trampolines: refuse to start when a need cannot be met
    /// by one. `shmtrace doctor` says which each need gets, and why.
    #[arg(
        long,
        value_enum,
        value_name = "BACKEND",
        default_value = "auto",
        global = true
    )]
    pub hooks: crate::capture::hooks::Backend,

    #[command(subcommand)]
    pub command: Option<Cmd>,

    /// The top-level options given on the command line (not defaulted): a
    /// subcommand takes its own, so these are refused with one.
    #[arg(skip)]
    pub given: Vec<String>,
}

impl Cli {
    /// Parses the process's arguments (usage errors exit 2, as clap's do).
    pub fn parse_args() -> Self {
        use clap::{CommandFactory, FromArgMatches, parser::ValueSource};
        let matches = Self::command().get_matches();
        let mut cli = Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        cli.given = matches
            .ids()
            .filter(|id| matches.value_source(id.as_str()) == Some(ValueSource::CommandLine))
            .map(|id| id.as_str().to_string())
            .filter(|id| id != "pid" && id != "hooks")
            .collect();
        crate::capture::hooks::choose_backend(cli.hooks);
        cli
    }
}

/// Where the results go, in every tracing mode (node-wide, --pid, run, demo).
#[derive(Args, Debug, Clone)]
pub struct TraceArgs {
    /// Write the full report as JSON to FILE (schema 2, schema/report.v2.schema.json: first_failure,
    /// failures, processes, mounts, lost_events...). Checked before tracing
    /// starts; if it still cannot be written at the end, the summary says so
    /// and the diagnosis is printed anyway.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,

    /// Stream every kernel event to FILE, one JSON object per line.
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,

    /// Do not print the summary or the live view on stderr.
    #[arg(short, long)]
    pub quiet: bool,

    /// Size of the ring buffer for ordinary events (fork, exec, mmap...):
    /// a power of two, at least one page. Failures have a ring of their
    /// own, so a full one loses context, never a failure (losses are counted).
    #[arg(long, value_name = "SIZE", default_value = "4M", value_parser = parse_ring)]
    pub events_ring: u32,

    /// Write each incident (a tmpfs mount that failed: its first failing
    /// process, later failures, holders, container or pod, diagnosis) to
    /// its own JSON file in DIR, rewritten while open and final when
    /// closed; the oldest are pruned past 500. Node-wide, one JSON line per
    /// incident opened and closed also goes to stdout, for log collectors.
    #[arg(long, value_name = "DIR")]
    pub incidents_dir: Option<PathBuf>,

    /// Seconds without a failure on a mount after which its incident
    /// closes; a later failure there opens a new one.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub incident_quiet: u64,
}

/// Node-wide tracing only: metrics, namespaces, and what the live stream
/// shows (-o also with --pid).
#[derive(Args, Debug, Clone)]
pub struct NodeArgs {
    /// Node-wide: serve Prometheus metrics (and /healthz) on ADDR: :9464
    /// (every interface), 127.0.0.1:9464, [::]:9464. Classic text format,
    /// or OpenMetrics when the scraper asks: /dev/shm size, use and peak
    /// per mount, bytes held per container, failures by reason, incidents,
    /// lost events.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen, conflicts_with = "pid")]
    pub metrics: Option<std::net::SocketAddr>,

    /// Node-wide: seconds a container's mount namespace (and its /dev/shm)
    /// stays watched after its last process exits.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 30,
        conflicts_with = "pid"
    )]
    pub ns_grace: u64,

    /// Node-wide: the identity labels metrics carry, a comma-separated
    /// subset of namespace,pod,container,container_id (fewer labels, fewer
    /// series; the series a dropped label split are summed). container_id
    /// is `<runtime>://<id>`, as kube-state-metrics writes it. Never a pid.
    #[arg(
        long,
        value_name = "LABELS",
        default_value = "namespace,pod,container,container_id",
        conflicts_with = "pid"
    )]
    pub metrics_labels: crate::output::metrics::LabelSet,

    /// Node-wide live stream: only pods in this Kubernetes namespace.
    #[arg(
        short = 'n',
        long = "namespace",
        value_name = "NS",
        conflicts_with = "pid"
    )]
    pub k8s_namespace: Option<String>,

    /// Node-wide live stream: only this pod (name, or UID).
    #[arg(
        short = 'p',
        long = "podname",
        value_name = "POD",
        conflicts_with = "pid"
    )]
    pub podname: Option<String>,

    /// Node-wide live stream: only this container (Kubernetes or runtime
    /// name, or an id prefix of at least 12 characters).
    #[arg(
        short = 'c',
        long = "containername",
        value_name = "NAME",
        conflicts_with = "pid"
    )]
    pub containername: Option<String>,

    /// Live stream format: `columns` (the live view on stderr) or `json`
    /// (one JSON object per failure on stdout, as it happens).
    #[arg(short = 'o', long = "output", value_name = "FORMAT", default_value = "columns", value_parser = ["columns", "json"])]
    pub output: String,
}

impl TraceArgs {
    fn outputs(&self) -> Outputs {
        Outputs {
            report: self.report.clone(),
            events: self.events.clone(),
            quiet: self.quiet,
            events_ring: Some(self.events_ring),
            live: false,
            metrics: None,
            incidents_dir: self.incidents_dir.clone(),
            incident_quiet: std::time::Duration::from_secs(self.incident_quiet),
            metrics_labels: crate::output::metrics::LabelSet::default(),
            filter: crate::output::filter::Filter::default(),
            json: false,
        }
    }
}

impl NodeArgs {
    /// `outputs` with the node-wide options (and the live view) added.
    fn apply(&self, outputs: Outputs) -> Outputs {
        Outputs {
            live: true,
            metrics: self.metrics,
            metrics_labels: self.metrics_labels,
            filter: crate::output::filter::Filter {
                namespace: self.k8s_namespace.clone(),
                pod: self.podname.clone(),
                container: self.containername.clone(),
            },
            json: self.output == "json",
            ..outputs
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Run CMD traced from its first instruction; print the diagnosis when it
    /// ends and exit with CMD's status (128+N when killed by signal N).
    #[command(
        after_help = "Example:\n  sudo shmtrace run --shm-size 64M --report r.json -- python train.py"
    )]
    Run {
        /// Give CMD a private /dev/shm of this size (a tmpfs in its own mount
        /// namespace), like `docker run --shm-size`. Accepts 64M, 1G, 65536k, bytes.
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        shm_size: Option<u64>,

        /// Run CMD as this user (name or uid). Under sudo the default is the
        /// user who ran sudo; `--user root` keeps root.
        #[arg(long, value_name = "USER")]
        user: Option<String>,

        /// When CMD fails on shared memory, run it again with a private
        /// /dev/shm of the size shmtrace computed, and say whether the failure
        /// is gone. Exits 0 only when the rerun no longer fails on shared memory.
        #[arg(long)]
        verify: bool,

        /// Show the live view too (it is on for --pid and node-wide):
        /// mounts with their use, top holders, recent failures, once a second.
        #[arg(long)]
        live: bool,

        #[command(flatten)]
        out: TraceArgs,

        /// The command and its arguments (after --).
        #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
        command: Vec<String>,
    },

    /// A built-in reproduction: a trainer and workers passing batches through
    /// a private 64 MiB /dev/shm until one dies of SIGBUS, traced.
    Demo {
        /// Number of worker processes.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
        workers: u32,

        /// Size of the private /dev/shm.
        #[arg(long, value_name = "SIZE", default_value = "64M", value_parser = parse_size)]
        shm_size: u64,

        /// Size of one batch, MiB.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
        batch_mib: u64,

        #[command(flatten)]
        out: TraceArgs,
    },

    /// What this machine and namespace support: kernel, BTF, tracefs,
    /// privileges, each hook (loaded for real), kprobe/fentry extras, and
    /// this namespace's /dev/shm with advice.
    Doctor,

    /// The demo's workload itself (used by `demo`).
    #[command(hide = true)]
    DemoWorkload {
        #[arg(long, default_value_t = 4)]
        workers: u32,
        #[arg(long, default_value_t = 8)]
        batch_mib: u64,
    },
}

pub async fn dispatch(cli: Cli) -> Result<i32> {
    if let (Some(cmd), Some(_)) = (&cli.command, cli.pid) {
        let name = cmd.name();
        return Err(Fail::new(
            2,
            format!("--pid cannot be combined with a subcommand (`{name}` starts its own job; --pid attaches to a running one)"),
        )
        .into());
    }
    if let (Some(cmd), Some(first)) = (&cli.command, cli.given.first()) {
        return Err(Fail::new(2, misplaced(cmd, first)).into());
    }
    match cli.command {
        None => {
            let outputs = cli.node.apply(cli.out.outputs());
            match cli.pid {
                Some(pid) => pid::attach(pid, outputs).await,
                None => node::node_wide(outputs, cli.node.ns_grace).await,
            }
        }
        Some(Cmd::Run {
            shm_size,
            user,
            verify,
            live,
            out,
            command,
        }) => {
            run::run(RunOpts {
                command,
                shm_size,
                user,
                outputs: Outputs {
                    live,
                    ..out.outputs()
                },
                mode: "run",
                verify,
            })
            .await
        }
        Some(Cmd::Demo {
            workers,
            shm_size,
            batch_mib,
            out,
        }) => {
            let exe = std::env::current_exe()?;
            let command = vec![
                exe.to_string_lossy().into_owned(),
                "demo-workload".into(),
                "--workers".into(),
                workers.to_string(),
                "--batch-mib".into(),
                batch_mib.to_string(),
            ];
            eprintln!(
                "shmtrace demo: {workers} workers, {batch_mib} MiB batches, a private /dev/shm of {} MiB",
                shm_size >> 20
            );
            // Root keeps the demo's binary reachable whatever the caller's home permissions.
            run::run(RunOpts {
                command,
                shm_size: Some(shm_size),
                user: Some("root".into()),
                outputs: out.outputs(),
                mode: "demo",
                verify: false,
            })
            .await
        }
        Some(Cmd::DemoWorkload { .. }) => unreachable!("handled in main"),
        Some(Cmd::Doctor) => crate::modes::doctor::doctor().await,
    }
}

/// Why top-level option `id` cannot go with subcommand `cmd`, and where
/// it goes instead.
fn misplaced(cmd: &Cmd, id: &str) -> String {
    use clap::CommandFactory;
    let flag = Cli::command()
        .get_arguments()
        .find(|a| a.get_id() == id)
        .and_then(|a| a.get_long())
        .map_or_else(|| id.to_string(), |l| format!("--{l}"));
    let name = cmd.name();
    let node_only = NodeArgs::augment_args(clap::Command::new("node"))
        .get_arguments()
        .any(|a| a.get_id() == id);
    if node_only {
        format!("{flag} is a node-wide option (shmtrace {flag} ...); `{name}` does not take it")
    } else if cmd.takes_trace_args() {
        format!("{flag} goes after the subcommand: shmtrace {name} {flag} ...")
    } else {
        format!(
            "`{name}` takes no options ({flag} is for tracing: shmtrace {flag} ... or shmtrace run {flag} ... -- CMD)"
        )
    }
}

impl Cmd {
    /// The subcommand as typed.
    fn name(&self) -> &'static str {
        match self {
            Cmd::Run { .. } => "run",
            Cmd::Demo { .. } => "demo",
            Cmd::Doctor => "doctor",
            Cmd::DemoWorkload { .. } => "demo-workload",
        }
    }

    /// Whether it takes --report, --events... of its own.
    fn takes_trace_args(&self) -> bool {
        matches!(self, Cmd::Run { .. } | Cmd::Demo { .. })
    }
}

/// A ring buffer size: a power of two number of bytes, at least a page.
fn parse_ring(s: &str) -> Result<u32> {
    let b = parse_size(s)?;
    if !b.is_power_of_two() || b > 1 << 30 {
        bail!("ring size `{s}` must be a power of two between 4k and 1G");
    }
    Ok(b as u32)
}

/// Where to listen, as exporters take it: ":9464" (every interface),
/// "0.0.0.0:9464", "[::]:9464", "localhost:9464". Names other than
/// localhost are refused rather than resolved (a DNS lookup would stall).
pub fn parse_listen(s: &str) -> Result<std::net::SocketAddr> {
    use std::net::{Ipv4Addr, SocketAddr};
    let bad = || {
        anyhow::anyhow!(
            "'{s}' is not a listen address: give :PORT, IP:PORT or [IPv6]:PORT (e.g. :9464, 127.0.0.1:9464, [::]:9464)"
        )
    };
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| bad())?;
        return Ok(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)));
    }
    if let Some(port) = s.strip_prefix("localhost:") {
        let port: u16 = port.parse().map_err(|_| bad())?;
        return Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
    }
    s.parse().map_err(|_| bad())
}

/// "64M", "1G", "65536k", "512MiB", "1048576" -> bytes.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = match num.parse() {
        Ok(n) => n,
        Err(_) => bail!("`{s}` is not a size (try 64M, 1G or a number of bytes)"),
    };
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => bail!("unknown size unit `{u}` in `{s}` (use k, M, G)"),
    };
    let bytes = (n * mult as f64) as u64;
    if bytes < 4096 {
        bail!("size `{s}` is smaller than one page");
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("65536k").unwrap(), 64 << 20);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("8192").unwrap(), 8192);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("10").is_err());
        assert!(parse_size("3Q").is_err());
        assert_eq!(parse_ring("4k").unwrap(), 4096);
        assert!(parse_ring("12k").is_err());
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn listen_addresses_as_exporters_take_them() {
        assert_eq!(parse_listen(":9466").unwrap().to_string(), "0.0.0.0:9466");
        assert_eq!(
            parse_listen("127.0.0.1:9464").unwrap().to_string(),
            "127.0.0.1:9464"
        );
        assert_eq!(parse_listen("[::]:9464").unwrap().to_string(), "[::]:9464");
        assert_eq!(
            parse_listen("localhost:80").unwrap().to_string(),
            "127.0.0.1:80"
        );
        for bad in ["notanaddr", ":", ":99999", "example.com:9464", "9464"] {
            let e = parse_listen(bad).unwrap_err().to_string();
            assert!(e.contains("not a listen address"), "{bad}: {e}");
        }
        // A bad address is a usage error, before anything starts.
        let e = Cli::try_parse_from(["shmtrace", "--metrics", "notanaddr"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    /// Each mode accepts and lists only its own options.
    #[test]
    fn flags_belong_to_their_mode() {
        use clap::CommandFactory;
        let parse = |args: &[&str]| {
            let mut argv = vec!["shmtrace"];
            argv.extend_from_slice(args);
            Cli::try_parse_from(argv)
        };
        for bad in [
            &["doctor", "--metrics", ":9466"][..],
            &["run", "-n", "kube-system", "--", "true"],
            &["run", "--metrics", ":9466", "--", "true"],
            &["demo", "--ns-grace", "1"],
            &["--pid", "1", "--metrics", ":9466"],
            &["--pid", "1", "-c", "trainer"],
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?} accepted");
        }
        let run = parse(&[
            "run", "--report", "r.json", "--live", "--", "python", "-u", "x",
        ])
        .unwrap();
        match run.command {
            Some(Cmd::Run {
                command, out, live, ..
            }) => {
                assert_eq!(command, ["python", "-u", "x"]);
                assert_eq!(out.report.as_deref(), Some(std::path::Path::new("r.json")));
                assert!(live);
            }
            other => panic!("{other:?}"),
        }
        // Top-level options before a subcommand are refused with where they go.
        let cli = Cli {
            given: vec!["report".into()],
            ..parse(&["--report", "r.json", "run", "--", "true"]).unwrap()
        };
        let msg = misplaced(cli.command.as_ref().unwrap(), &cli.given[0]);
        assert!(msg.contains("shmtrace run --report"), "{msg}");
        let msg = misplaced(&Cmd::Doctor, "metrics");
        assert!(msg.contains("node-wide option"), "{msg}");
        let msg = misplaced(&Cmd::Doctor, "k8s_namespace");
        assert!(msg.contains("--namespace"), "{msg}");

        // --help of each subcommand lists no node-wide option.
        let mut top = Cli::command();
        for sub in ["run", "demo", "doctor"] {
            let help = top
                .find_subcommand_mut(sub)
                .unwrap()
                .render_long_help()
                .to_string();
            for node_only in [
                "--metrics",
                "--ns-grace",
                "--namespace",
                "--podname",
                "--output",
            ] {
                assert!(!help.contains(node_only), "{sub} --help lists {node_only}");
            }
        }
        let doctor = top
            .find_subcommand_mut("doctor")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(!doctor.contains("--report"), "{doctor}");
    }
}
