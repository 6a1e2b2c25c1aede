#!/usr/bin/env bash
# Installs everything shmtrace needs to build and run, idempotently.
# Fast when already present: each step checks before it installs.
#   scripts/setup.sh          build prerequisites (rust-src, LLVM 22, bpf-linker)
#   scripts/setup.sh --test   also the test workloads (bpftool, tmux, Debian and PyPI PyTorch)
set -euo pipefail

want_test=0
[[ "${1:-}" == "--test" ]] && want_test=1

say() { printf 'setup: %s\n' "$*" >&2; }

if [[ $(id -u) -ne 0 ]]; then
    say "must run as root (installs packages); as a user: sudo $0 $*"
    exit 1
fi

apt_updated=0
apt_install() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    if [[ $apt_updated -eq 0 ]]; then
        say "apt-get update"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        apt_updated=1
    fi
    say "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Rust eBPF target needs core built from source.
if ! rustup component list --installed 2>/dev/null | grep -q '^rust-src'; then
    say "rustup component add rust-src"
    rustup component add rust-src
fi

# bpf-linker must link against the same LLVM major as rustc (22 for Rust 1.95).
apt_install llvm-22-dev libpolly-22-dev libzstd-dev zlib1g-dev
if ! command -v bpf-linker >/dev/null 2>&1 && [[ ! -x "$HOME/.cargo/bin/bpf-linker" ]]; then
    say "cargo install bpf-linker (about 3 minutes)"
    LLVM_PREFIX=/usr/lib/llvm-22 LLVM_SYS_221_PREFIX=/usr/lib/llvm-22 cargo install --locked bpf-linker \
        --no-default-features --features llvm-22
fi

if [[ $want_test -eq 1 ]]; then
    # bpftool: tests check nothing stays attached. tmux: live-view tests.
    # python3-torch: Debian's PyTorch 1.13 (SIGBUS path).
    apt_install bpftool tmux python3-torch python3-venv
    # promtool (Debian's prometheus): metrics format and alerting-rule tests.
    apt_install prometheus python3-yaml
    # PostgreSQL 15 (Debian's): a parallel hash join that outgrows /dev/shm.
    apt_install postgresql-15
    # A second kernel and a cgroup-v2-only node: Debian 12's 6.1 under QEMU
    # (TCG), booted from an initramfs of static busybox (tests/tests/vm.rs).
    # The kernel package is only unpacked into the cache, never installed.
    apt_install qemu-system-x86 busybox-static cpio
    vm_cache=/var/cache/shmtrace/vm
    if ! ls "$vm_cache"/boot/vmlinuz-6.1.* >/dev/null 2>&1; then
        mkdir -p "$vm_cache"
        [[ $apt_updated -eq 1 ]] || { DEBIAN_FRONTEND=noninteractive apt-get update -qq; apt_updated=1; }
        kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-6\.1/ {print $2; exit}')
        [[ -n "$kpkg" ]] || { say "no linux-image-6.1 package in Debian's index"; exit 1; }
        say "fetching $kpkg for the VM test (unpacked into $vm_cache, not installed)"
        (cd "$vm_cache" && apt-get download -qq "$kpkg" 2>/dev/null &&
            dpkg-deb --fsys-tarfile "$kpkg"_*.deb | tar -x --wildcards './boot/vmlinuz-*' &&
            rm -f "$kpkg"_*.deb)
    fi
    # The fleet's other kernels: Debian 11's 5.10 (Amazon Linux 2's
    # generation) and 6.12 (the current LTS) from bookworm-backports, with
    # an apt configuration of the suite's own: the machine's sources and
    # package lists stay as they are.
    if ! ls "$vm_cache"/boot/vmlinuz-5.10.* >/dev/null 2>&1 ||
        ! ls "$vm_cache"/boot/vmlinuz-6.12.* >/dev/null 2>&1; then
        apt_dir=$vm_cache/apt
        mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial"
        uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
        [[ -n "$uri" ]] || uri=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
        [[ -n "$uri" ]] || { say "no Debian archive URI in the machine's apt sources"; exit 1; }
        printf 'deb %s bullseye main\ndeb %s bookworm-backports main\n' "$uri" "$uri" > "$apt_dir/sources.list"
        own=(-o APT::Sandbox::User=root -o Dir::Etc::sourcelist="$apt_dir/sources.list" -o Dir::Etc::sourceparts=/nonexistent
            -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache::Archives="$apt_dir/archives")
        say "apt-get update (the suite's own sources: bullseye, bookworm-backports)"
        apt-get "${own[@]}" update -qq
        for series in '5\.10' '6\.12'; do
            ver=${series//\\/}
            ls "$vm_cache"/boot/vmlinuz-"$ver".* >/dev/null 2>&1 && continue
            # The plain -amd64 flavour, newest ABI.
            kpkg=$(apt-cache "${own[@]}" search --names-only "^linux-image-$series\.[0-9.+~a-z-]*-amd64\$" |
                awk '{print $1}' | grep -v -e '-cloud-' -e '-rt-' | sort -V | tail -1)
            [[ -n "$kpkg" ]] || { say "no linux-image-$ver package in the archive"; exit 1; }
            say "fetching $kpkg for the VM tests (unpacked into $vm_cache, not installed)"
            (cd "$apt_dir/archives" && apt-get "${own[@]}" download -qq "$kpkg" &&
                dpkg-deb --fsys-tarfile "$kpkg"_*.deb | (cd "$vm_cache" && tar -x --wildcards './boot/vmlinuz-*') &&
                rm -f "$kpkg"_*.deb)
        done
    fi
    # A real container runtime (runc: crun refuses hybrid cgroup layouts).
    apt_install podman runc conmon
    # PyPI's PyTorch (posix_fallocate ENOSPC path), kept outside the checkout.
    venv=${SHMTRACE_TORCH_VENV:-/var/cache/shmtrace/torch-venv}
    if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
        say "pip install torch into $venv (several minutes, ~5 GB)"
        /usr/bin/python3 -m venv "$venv"
        "$venv/bin/pip" install -q torch
    fi
    # PyPI's Ray (its plasma object store in /dev/shm), beside it.
    ray_venv=${SHMTRACE_RAY_VENV:-/var/cache/shmtrace/ray-venv}
    if [[ ! -x "$ray_venv/bin/python" ]] || ! "$ray_venv/bin/python" -c 'import ray' 2>/dev/null; then
        say "pip install ray into $ray_venv (about a minute, ~300 MB)"
        /usr/bin/python3 -m venv "$ray_venv"
        "$ray_venv/bin/pip" install -q ray
    fi
fi
say "ready"
