//! Debian kernels under QEMU, for the suite's kernel matrix (tests/vm.rs)
//! and the in-VM benchmark (`cargo xtask bench --vm`): the kernel that
//! scripts/setup.sh --test extracted, an initramfs of static busybox, this
//! shmtrace with its libraries and static programs, and a boot whose /init
//! writes `=== NAME FILE ===` sections to a second serial port. Only std
//! and anyhow: xtask includes this file as it is.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

/// Where scripts/setup.sh --test puts the kernels (never installed).
pub const BOOT_DIR: &str = "/var/cache/shmtrace/vm/boot";

/// The newest `vmlinuz-SERIES.*` setup.sh extracted.
pub fn kernel(series: &str) -> Result<PathBuf> {
    let dir = Path::new(BOOT_DIR);
    let prefix = format!("vmlinuz-{series}.");
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| {
            format!(
                "no kernels in {}: run scripts/setup.sh --test",
                dir.display()
            )
        })?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .collect();
    found.sort();
    found.pop().with_context(|| {
        format!(
            "no {prefix}* in {} (5.10, 6.1 and 6.12 are fetched): run scripts/setup.sh --test",
            dir.display()
        )
    })
}

/// A static build of the C program `src` into `out`.
pub fn static_build(src: &Path, out: &Path) -> Result<PathBuf> {
    let st = Command::new("gcc")
        .args(["-O2", "-static", "-o"])
        .arg(out)
        .arg(src)
        .status()
        .context("gcc")?;
    if !st.success() {
        bail!("cannot build {} statically", src.display());
    }
    Ok(out.to_path_buf())
}

/// The tree of an initramfs being made.
pub struct Initramfs {
    root: PathBuf,
}

impl Initramfs {
    /// An empty tree under `dir` with busybox and the directories /init
    /// mounts on.
    pub fn new(dir: &Path) -> Result<Self> {
        let root = dir.join("root");
        for d in ["proc", "sys", "dev", "tmp", "work", "var/tmp"] {
            std::fs::create_dir_all(root.join(d))?;
        }
        let me = Self { root };
        me.put(Path::new("/bin/busybox"), "/bin/busybox")?;
        Ok(me)
    }

    /// Copies `from` to `to` in the tree.
    pub fn put(&self, from: &Path, to: &str) -> Result<()> {
        let dst = self.root.join(to.trim_start_matches('/'));
        std::fs::create_dir_all(dst.parent().unwrap())?;
        std::fs::copy(from, &dst).with_context(|| format!("{}", from.display()))?;
        Ok(())
    }

    /// Copies the dynamic executable `exe` to `to` with the libraries and
    /// loader ldd lists for it, at their paths.
    pub fn put_dynamic(&self, exe: &Path, to: &str) -> Result<()> {
        self.put(exe, to)?;
        let out = Command::new("ldd").arg(exe).output().context("ldd")?;
        for lib in String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                l.split_whitespace()
                    .find(|w| w.starts_with('/'))
                    .map(PathBuf::from)
            })
        {
            let canon = std::fs::canonicalize(&lib)?;
            self.put(&canon, &lib.to_string_lossy())?;
        }
        Ok(())
    }

    /// The tree as a gzipped newc cpio at `out`.
    pub fn pack(&self, out: &Path) -> Result<PathBuf> {
        let st = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "cd {} && find . | cpio -o -H newc --quiet | gzip -1 > {}",
                self.root.display(),
                out.display()
            ))
            .status()?;
        if !st.success() {
            bail!("cpio of {}", self.root.display());
        }
        Ok(out.to_path_buf())
    }
}

/// What a boot left: the data port, the console.
pub struct Booted {
    pub data: String,
    pub console: String,
    pub elapsed: Duration,
}

/// Boots `kernel` with `initrd` and `append` on the kernel command line
/// (after the console and cgroup settings every guest has) under TCG with
/// 2 CPUs and 2 GiB, and waits for it to power off, at most `limit`.
/// Err: QEMU failed or the guest ran past the limit (killed), with its
/// console and data so far.
pub fn boot(
    kernel: &Path,
    initrd: &Path,
    append: &str,
    dir: &Path,
    limit: Duration,
) -> Result<Booted> {
    let (console, data) = (dir.join("console.log"), dir.join("data.log"));
    let start = Instant::now();
    let mut qemu = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-cpu", "max", "-smp", "2", "-m", "2048"])
        .args(["-nodefaults", "-display", "none", "-no-reboot"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 panic=-1 rdinit=/init root=/dev/ram0 cgroup_no_v1=all quiet {append}"
        ))
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-serial")
        .arg(format!("file:{}", data.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("qemu-system-x86_64: run scripts/setup.sh --test (Debian's qemu-system-x86)")?;
    let read = || {
        (
            std::fs::read_to_string(&data).unwrap_or_default(),
            std::fs::read_to_string(&console).unwrap_or_default(),
        )
    };
    loop {
        if let Some(st) = qemu.try_wait()? {
            let (data, console) = read();
            if !st.success() {
                bail!("qemu: {st}\nconsole:\n{console}\ndata:\n{data}");
            }
            return Ok(Booted {
                data,
                console,
                elapsed: start.elapsed(),
            });
        }
        if start.elapsed() > limit {
            let _ = qemu.kill();
            let _ = qemu.wait();
            let (data, console) = read();
            bail!("the guest did not finish in {limit:?}; console:\n{console}\ndata:\n{data}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Each `=== NAME FILE ===` section of a data port, by (NAME, FILE).
pub fn sections(data: &str) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    let mut key: Option<(String, String)> = None;
    let mut body = String::new();
    for line in data.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(head) = line
            .strip_prefix("=== ")
            .and_then(|l| l.strip_suffix(" ==="))
        {
            if let Some(k) = key.take() {
                out.insert(k, std::mem::take(&mut body));
            }
            let mut words = head.splitn(2, ' ');
            let name = words.next().unwrap_or("").to_string();
            let file = words.next().unwrap_or("").to_string();
            key = Some((name, file));
        } else {
            body.push_str(line);
            body.push('\n');
        }
    }
    if let Some(k) = key {
        out.insert(k, body);
    }
    out
}
