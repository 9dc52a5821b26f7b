"""The engine's C++ kernels for compiled CPU forwards: built for this CPU on first use, then cached.

Two small custom ops, registered under `torch.ops.specdec` and called from inside compiled graphs (inductor
treats each as one opaque call):

- `half_linear` (`half_matmul.cpp`, used by `half_weights`): a few tokens times float16 weights, in fp32;
- `filled_attention` (`filled_attention.cpp`, used by `filled_attention`): attention over the filled slots of
  a static cache rather than the whole preallocated buffer.

Both are built together by `torch.utils.cpp_extension.load` (about half a minute, once; torch caches the build
under ~/.cache/torch_extensions). They need an x86 CPU with AVX2, FMA and F16C (the matrix multiply's vector
instructions) and a C++ compiler; anywhere else, or if the build fails for any reason, compiled forwards run
without them (inductor's own code, the same results) and the reason is printed once.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

SOURCES = [Path(__file__).with_name(name) for name in ("half_matmul.cpp", "filled_attention.cpp")]


@functools.cache
def kernels_loaded() -> bool:
    """Whether `torch.ops.specdec.half_linear` and `torch.ops.specdec.filled_attention` are loaded (built on
    the first call; False, with the reason printed, where this CPU or machine cannot build them)."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False
    from torch.utils import cpp_extension

    print("specdec: loading the C++ kernels of compiled forwards (built once for this CPU)", file=sys.stderr,
          flush=True)
    try:
        cpp_extension.load(name="specdec_cpu_kernels", sources=[str(path) for path in SOURCES],
                           is_python_module=False, extra_cflags=["-O3", "-march=native", "-fopenmp"],
                           extra_ldflags=["-fopenmp"])
    except Exception as error:  # noqa: BLE001 - any failure (no compiler, no ninja, a read-only cache): fall back
        print(f"specdec: the C++ kernels could not be built ({str(error).splitlines()[0]}); compiled forwards "
              "use inductor's code instead", file=sys.stderr, flush=True)
        return False
    register_fake = torch.library.register_fake
    register_fake("specdec::half_linear")(
        lambda x, packed, bias, out_features: x.new_empty(x.shape[0], out_features))
    register_fake("specdec::filled_attention")(
        lambda query, key, value, mask, scale: query.new_empty(query.shape[0], query.shape[2], query.shape[1],
                                                               value.shape[-1]))
    return True
