"""Mining's models run SDPA without cuDNN's kernel on a GPU (pipeline/models/attention_kernels.py): cuDNN builds a
plan for every new shape, and decoding steps and token-budget batches are all new shapes. The switch is torch's
process-wide flag, so it is counted: overlapping holders (two stages' threads) keep it off until the last one
leaves, and what was there before comes back. On a CPU nothing is touched. The encoder's and the translator's
attention calls run under it (the device is made to read as CUDA here; the arithmetic stays the CPU's)."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from contramine.pipeline.models import attention_kernels
from contramine.pipeline.models.attention_kernels import without_cudnn_attention
from tests.test_backtranslate import LINES, cfg, tiny  # noqa: F401 (tiny: the module's fixture)

cudnn_on = torch.backends.cuda.cudnn_sdp_enabled


@pytest.fixture
def flag_restored():
    before = cudnn_on()
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)
    assert attention_kernels._holders == 0


def test_on_a_cuda_device_cudnn_is_off_inside_and_back_after(flag_restored):
    torch.backends.cuda.enable_cudnn_sdp(True)
    with without_cudnn_attention("cuda:0"):
        assert not cudnn_on()
        with without_cudnn_attention(torch.device("cuda")):  # nested: still off after the inner one leaves
            assert not cudnn_on()
        assert not cudnn_on()
    assert cudnn_on()
    torch.backends.cuda.enable_cudnn_sdp(False)  # a user who had turned it off keeps it off
    with without_cudnn_attention("cuda"):
        assert not cudnn_on()
    assert not cudnn_on()


def test_a_cpu_device_touches_nothing(flag_restored):
    torch.backends.cuda.enable_cudnn_sdp(True)
    with without_cudnn_attention("cpu"):
        assert cudnn_on()
    assert attention_kernels._holders == 0


def test_an_error_inside_still_puts_the_flag_back(flag_restored):
    torch.backends.cuda.enable_cudnn_sdp(True)
    with pytest.raises(ValueError):
        with without_cudnn_attention("cuda"):
            raise ValueError("a batch failed")
    assert cudnn_on()


def test_overlapping_threads_keep_it_off_until_the_last_leaves(flag_restored):
    """Thread A enters, B enters, A leaves while B still runs: B's calls must not see cuDNN back (torch's own
    sdpa_kernel would restore A's saved state here); after B leaves the flag is what A found."""
    torch.backends.cuda.enable_cudnn_sdp(True)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with without_cudnn_attention("cuda"):
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b():
        a_in.wait(5)
        with without_cudnn_attention("cuda"):
            b_in.set()
            a_out.wait(5)
            seen["b after a left"] = cudnn_on()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"b after a left": False}
    assert cudnn_on()


@pytest.fixture
def sdpa_calls(monkeypatch, flag_restored):
    """The cuDNN flag as every SDPA call saw it, with devices read as CUDA (the model and its tensors stay on the
    CPU, where the flag changes nothing: the outputs are the CPU's)."""
    torch.backends.cuda.enable_cudnn_sdp(True)
    monkeypatch.setattr(attention_kernels, "on_cuda", lambda device: True)
    seen = []
    real = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        seen.append(cudnn_on())
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return seen


def test_the_encoder_runs_its_batches_without_cudnn(sdpa_calls):
    from tests.tiny_bert import tiny_encoder

    enc = tiny_encoder(pooler="mean")
    enc.model.config._attn_implementation = "sdpa"
    enc.encode(LINES[:12], batch_size=4)
    assert sdpa_calls and not any(sdpa_calls)
    assert cudnn_on()


@pytest.mark.parametrize("decoder", ["loop", "generate"])
def test_the_translator_decodes_without_cudnn(tiny, sdpa_calls, decoder):
    from contramine.pipeline.models.translate.chains import load_translator

    tr = load_translator(tiny["marian-en-xx"], cfg(decoder=decoder, batch_size=8))
    assert tr.model.config._attn_implementation == "sdpa"
    tr.translate(LINES[:10])
    assert len(sdpa_calls) > 10 and not any(sdpa_calls)
    assert cudnn_on()
