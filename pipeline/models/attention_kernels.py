"""Which attention kernels the mining models may use on a GPU: every fused kernel of SDPA but cuDNN's.

Why. On sm90 / sm100 cards (H100, H200, B200) torch puts cuDNN's attention first among SDPA's kernels (torch 2.11 and
2.13: `check_prefer_cudnn_attention` in aten's sdp_utils.cpp, with cuDNN >= 9.15). cuDNN runs a graph built for
each problem shape (batch, heads, query and key lengths, strides, mask) and caches it per thread; building one costs
tens of milliseconds of host time. Mining changes shapes all the time: a decoding step's keys grow by one position,
finished rows leave the batch every few steps, and every token-budget batch has its own rows x length. In the H200
check's trace (2026-11-28, docs/gpu/h200-2026-11-28-profile.txt: 64 rows translated), 139 of the 1,548 attention
calls built a plan, median 53.5 ms of host time: 6.8 s of the run's 8.0 s, with the card busy 2% of it. The
encoder's rows point the same way: bf16 (which cuDNN takes) ran slower than float32 (which it does not). Flash
attention and the memory-efficient kernel build nothing; without cuDNN they take these calls (flash where no mask
is passed, the memory-efficient kernel where one is), with float32 accumulation as cuDNN's.

How. torch's switch is process-wide (torch.backends.cuda.enable_cudnn_sdp; `sdpa_kernel` sets the same flag), so
`without_cudnn_attention(device)` counts its holders: the first one in turns cuDNN off, the last one out puts back
what it found, and two stages' threads running at once do not undo each other. Another thread of the same process
that runs SDPA meanwhile gets flash / memory-efficient too (another kernel, the same arithmetic class; TF32 is the
kind of process-wide switch that would change precision, and nothing here touches it). Training keeps cuDNN: its
shapes repeat (batch x at most max_length tokens), so its graphs are built once.

On a CPU (no cuDNN attention there) it does nothing: the CPU's tables do not move.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

import torch

# The GPU check's contrast rows set this to True (bench/gpu: "*_cudnn" rows): what the same work costs with cuDNN's
# attention allowed, as torch picks by default. Not a setting: a kernel choice on a GPU is not in any key.
ALLOW_CUDNN = False

_lock = threading.Lock()
_holders = 0  # callers inside without_cudnn_attention on a CUDA device
_found = True  # the flag as the first of them found it


def on_cuda(device) -> bool:
    """Whether `device` (a torch.device or its name) is a CUDA device: where cuDNN's attention can run."""
    return torch.device(device).type == "cuda"


@contextmanager
def without_cudnn_attention(device):
    """SDPA without cuDNN's kernel while the block runs, where `device` is a CUDA device (module docstring)."""
    global _holders, _found
    if not on_cuda(device) or ALLOW_CUDNN:
        yield
        return
    with _lock:
        if _holders == 0:
            _found = torch.backends.cuda.cudnn_sdp_enabled()
            torch.backends.cuda.enable_cudnn_sdp(False)
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                torch.backends.cuda.enable_cudnn_sdp(_found)
