#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs
# (idempotent, quick when present), builds, then runs every test. The
# integration tests load shmtrace's real eBPF programs: run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) -ne 0 ]]; then
    echo "test.sh: the tests load eBPF programs and mount tmpfs: run as root (as a user: sudo $0)" >&2
    exit 1
fi
export PATH="$HOME/.cargo/bin:$PATH"
scripts/setup.sh --test
cargo build --release --locked -p shmtrace
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
rm -f target/vm-tested-*.txt
# tee through a process substitution, not a pipe: a process a failed test
# left behind may hold the output open, and a pipeline would wait for it.
cargo test --release --locked --no-fail-fast --workspace --lib --bins --tests -- --test-threads=2 > >(tee "$log") 2>&1
status=$?
# A failed test may leave a workload waiting for its finish file, or an agent.
pkill -f "$PWD/target/test-workloads/" 2>/dev/null || true
pkill -INT -f "^$PWD/target/release/shmtrace " 2>/dev/null || true
# Not `wait` for tee: a stray writer would hold it; a moment lets it flush.
sleep 1
set -e
# The second kernel the VM test booted, when it passed.
for k in 5.10 6.1 6.12; do cat target/vm-tested-$k.txt 2>/dev/null || echo "vm: the $k VM test did not pass (see above)"; done
# One closing line for the whole suite.
awk '/^test result:/ { p += $4; f += $6 } END { printf "shmtrace suite: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
