"""Strict float32 for evaluation: TF32 and autocast off while dev and test scores are computed, the caller's
settings back after (contramine.trainer.evaluate and the training loop's dev evaluation use it)."""
from __future__ import annotations

from contextlib import contextmanager

# torch >= 2.9's per-backend settings behind the legacy flags ("none" = inherit); absent ones are skipped.
_FP32_PRECISION_KNOBS = ("backends", "backends.cuda.matmul", "backends.cudnn", "backends.cudnn.conv",
                         "backends.cudnn.rnn", "backends.mkldnn", "backends.mkldnn.matmul", "backends.mkldnn.conv",
                         "backends.mkldnn.rnn")


def _fp32_precision_knobs() -> dict:
    import torch

    knobs = {}
    for path in _FP32_PRECISION_KNOBS:
        obj = torch
        for part in path.split("."):
            obj = getattr(obj, part, None)
        try:
            knobs[path] = (obj, obj.fp32_precision)
        except (AttributeError, RuntimeError):
            pass
    return knobs


def float32_settings() -> tuple:
    """(cuda.matmul.allow_tf32, cudnn.allow_tf32, float32 matmul precision): what strict_float32 switches."""
    import torch

    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision())


@contextmanager
def restored_float32_settings():
    """Put the float32 matmul settings back as they were on exit: the legacy flags (TF32 for cuBLAS and cuDNN,
    torch.get_float32_matmul_precision()) and, where torch has them (>= 2.9), the per-backend fp32_precision values
    they are views of: restoring "high" through the legacy API alone would also switch oneDNN's CPU matmuls, which
    `allow_tf32 = True` never touched."""
    import torch

    try:
        legacy = float32_settings()
    except RuntimeError:  # set through the new API only (torch >= 2.9): the legacy getters refuse; the knobs suffice
        legacy = None
    knobs = _fp32_precision_knobs()
    try:
        yield
    finally:
        if legacy is not None:
            matmul, cudnn, precision = legacy
            torch.backends.cudnn.allow_tf32 = cudnn
            torch.backends.cuda.matmul.allow_tf32 = matmul
            torch.set_float32_matmul_precision(precision)  # after allow_tf32, which resets it to "high" / "highest"
        for obj, value in knobs.values():
            if obj.fp32_precision != value:
                obj.fp32_precision = value


@contextmanager
def strict_float32():
    """Evaluation numbers in strict float32, whatever the training loop set: TF32 off for cuBLAS and cuDNN, float32
    matmul precision "highest" (no TF32 / bf16 passes, GPU or CPU), no autocast from an enclosing block; all put
    back on exit. An encoder's own evaluation precision (`eval_precision` / `--precision` bf16 or fp16, float32 by
    default) still applies inside `Encoder.encode`: that one is asked for explicitly."""
    import torch  # here, not at import: `--compare` and the report read results without torch

    with restored_float32_settings():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        with torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
            yield


# ---------------------------------------------------------------- embeddings
