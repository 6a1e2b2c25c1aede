#!/usr/bin/env bash
# Sets everything up on a fresh machine (idempotent), builds shmtrace, and
# runs its built-in demo: a real DataLoader-style job dying of SIGBUS in a
# private 64 MiB /dev/shm, diagnosed. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) -ne 0 ]]; then
    echo "demo.sh: shmtrace loads eBPF programs: run as root (as a user: sudo $0)" >&2
    exit 1
fi
export PATH="$HOME/.cargo/bin:$PATH"
scripts/setup.sh
cargo build --release --locked -p shmtrace
exec target/release/shmtrace demo "$@"
