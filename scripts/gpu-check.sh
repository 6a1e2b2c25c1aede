#!/bin/sh
# A real CUDA IPC failure on a GPU machine, traced: shmtrace must report it
# as cuda-ipc (GPU-side), never as a /dev/shm size.
#
#   scripts/gpu-check.sh [OUT_DIR]
#
# Needs: a built target/release/shmtrace, an NVIDIA GPU and driver, and a
# python with PyPI's torch (the venv scripts/setup.sh --test makes, or
# $PYTHON). What it does: the process exports a CUDA allocation with
# cudaIpcGetMemHandle and then opens that handle itself with
# cudaIpcOpenMemHandle, which CUDA refuses (a handle cannot be opened in the
# process that exported it): a real error from the real driver.
set -eu
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/shmtrace-gpu-check}}
mkdir -p "$out"
python=${PYTHON:-/var/cache/shmtrace/torch-venv/bin/python}
nvidia-smi -L
cat > "$out/ipc.py" <<'PY'
import ctypes, glob, json, os, sys, time
import torch
assert torch.cuda.is_available(), "no GPU"
lib = sorted(glob.glob(sys.prefix + "/lib/python3*/site-packages/nvidia/cu*/lib/libcudart.so*"))[0]
rt = ctypes.CDLL(lib)
x = torch.empty(1 << 20, device="cuda")
time.sleep(2.5)  # shmtrace attaches its uprobes once a second
handle = ctypes.create_string_buffer(64)
got = rt.cudaIpcGetMemHandle(handle, ctypes.c_void_p(x.data_ptr()))
ptr = ctypes.c_void_p()
opened = rt.cudaIpcOpenMemHandle(ctypes.byref(ptr), handle, 1)
print(json.dumps({"pid": os.getpid(), "get": got, "open": opened}), flush=True)
PY
target/release/shmtrace run --report "$out/report.json" -- "$python" "$out/ipc.py" \
  > "$out/stdout" 2> "$out/stderr" || true
cat "$out/stdout" "$out/stderr"
"$python" - "$out/report.json" "$out/stdout" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
truth = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
assert truth["open"] != 0, "cudaIpcOpenMemHandle of its own handle succeeded?"
ipc = [f for f in r["failures"] if f["kind"] == "cuda_ipc" and f["pid"] == truth["pid"]]
assert ipc, "no cuda_ipc failure in the report"
assert any(f["syscall"] == "cudaIpcOpenMemHandle" and f"returned {truth['open']} (" in f["cause"] for f in ipc), ipc
d = r["diagnosis"]
assert d["signature"].startswith("cuda-ipc:"), d
assert d["recommended_shm_bytes"] is None, d
print("gpu-check: ok:", d["signature"], "-", ipc[0]["cause"])
PY
