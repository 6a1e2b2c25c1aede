"""Calls cudaIpcGetMemHandle through the real CUDA runtime PyPI's PyTorch
ships (no GPU needed: on a machine without one it returns a real error
code, which is what shmtrace must capture). Prints the code it got."""
import ctypes
import glob
import json
import os
import sys
import time

lib = sorted(glob.glob(sys.prefix + "/lib/python3*/site-packages/nvidia/cu*/lib/libcudart.so*"))[0]
cudart = ctypes.CDLL(lib)
# shmtrace looks for CUDA libraries in traced processes once a second.
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 2.5)
handle = ctypes.create_string_buffer(64)
err = cudart.cudaIpcGetMemHandle(handle, ctypes.c_void_p(0))
print(json.dumps({"pid": os.getpid(), "error": err, "lib": lib}), flush=True)
