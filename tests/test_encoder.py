"""The shared encoder loads any HF encoder architecture: the BERT pooler where the model class takes one, plain
models (ELECTRA, DistilBERT) where it does not — decided from the constructor, not from a list of model types."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from transformers import BertTokenizerFast, DistilBertConfig, DistilBertModel, ElectraConfig, ElectraModel

from contramine.pipeline.config import SHARED_DATA
from contramine.pipeline.models.encode.encoder import Encoder, _takes_pooling_layer
from tiny_bert import build_tiny_bert, write_vocab

TEXTS = ["the man plays the guitar .", "a dog ran in the park", "two women were walking home"]


def _save(model, out, vocab_dir):
    model.save_pretrained(out)
    BertTokenizerFast.from_pretrained(str(vocab_dir)).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("vocab")
    write_vocab(d / "vocab.txt")
    return d


@pytest.fixture(scope="module")
def electra(tmp_path_factory, vocab_dir):
    n = len((vocab_dir / "vocab.txt").read_text().split())
    torch.manual_seed(0)
    model = ElectraModel(ElectraConfig(vocab_size=n, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=64, max_position_embeddings=64))
    return _save(model, tmp_path_factory.mktemp("electra") / "m", vocab_dir)


@pytest.fixture(scope="module")
def distilbert(tmp_path_factory, vocab_dir):
    n = len((vocab_dir / "vocab.txt").read_text().split())
    torch.manual_seed(0)
    model = DistilBertModel(DistilBertConfig(vocab_size=n, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                             max_position_embeddings=64))
    return _save(model, tmp_path_factory.mktemp("distilbert") / "m", vocab_dir)


@pytest.mark.parametrize("which", ["electra", "distilbert"])
@pytest.mark.parametrize("pooler", ["mean", "cls", "cls_before_pooler", "avg_first_last"])
def test_models_without_a_pooling_layer_load_and_encode(request, which, pooler):
    path = request.getfixturevalue(which)
    assert not _takes_pooling_layer(str(path))
    enc = Encoder.load(str(path), pooler=pooler, max_length=16)
    vecs = enc.encode(TEXTS)
    assert vecs.shape == (3, 32) and np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-5)
    if pooler == "cls":  # no pooler output: the [CLS] state, as cls_before_pooler
        ref = Encoder.load(str(path), pooler="cls_before_pooler", max_length=16).encode(TEXTS)
        np.testing.assert_allclose(vecs, ref, atol=1e-6)


def test_bert_keeps_its_pooling_layer(tmp_path):
    path = build_tiny_bert(tmp_path / "bert")
    assert _takes_pooling_layer(str(path))
    enc = Encoder.load(str(path), pooler="cls", max_length=16)
    assert enc.model.pooler is not None
    cls = enc.encode(TEXTS)
    before = Encoder.load(str(path), pooler="cls_before_pooler", max_length=16).encode(TEXTS)
    assert not np.allclose(cls, before, atol=1e-3)  # dense + tanh over [CLS] really ran


def test_autocast_precision_is_a_setting():
    """encode's autocast: float32 by default (exact numbers), bf16 on request; vectors come back float32."""
    from tiny_bert import tiny_encoder

    enc = tiny_encoder(pooler="mean")
    exact = enc.encode(TEXTS)
    enc.precision = "bf16"
    low = enc.encode(TEXTS)
    assert low.dtype == np.float32 and not np.array_equal(low, exact)
    np.testing.assert_allclose(low, exact, atol=5e-2)


# ---- Encoder.encode's feeding (pipeline/models/encode/batches.py): tokenised ahead, batched per device kind
WIKI = [t for t in (line.strip() for line in (SHARED_DATA / "wiki1m_head.txt").open(encoding="utf-8")) if t][:300]
ODD = ["", "x", "word " * 200, "é ü 中文 ﬁ tokens", "[MASK] and [SEP] inside", "   spaces   "]


@pytest.fixture
def threaded(monkeypatch):
    """Small chunks and two tokenising threads, so a few hundred texts take the threaded path."""
    from contramine.pipeline.models.encode import batches as encode_batches
    from contramine.pipeline.models.encode import encoder

    monkeypatch.setattr(encode_batches, "CHUNK_ROWS", 37)
    monkeypatch.setattr(encoder, "tokenize_threads", lambda: 2)


def test_chunk_tokens_equal_the_hf_tokenizer_and_leave_it_as_it_was():
    """encode tokenises through its own copy of the fast backend: the same ids and type ids as
    `tokenizer(texts, truncation=True, max_length=...)`, and the shared tokenizer's settings are untouched."""
    from tiny_bert import tiny_encoder

    enc = tiny_encoder(pooler="mean", max_length=24)
    before = (enc.tokenizer.backend_tokenizer.truncation, enc.tokenizer.backend_tokenizer.padding)
    texts = WIKI[:50] + ODD
    got = enc._token_arrays(np.arange(len(texts)), texts, None, 24)
    after = (enc.tokenizer.backend_tokenizer.truncation, enc.tokenizer.backend_tokenizer.padding)
    want = enc.tokenizer(texts, truncation=True, max_length=24)
    assert [list(r[:n]) for r, n in zip(got.ids, got.lengths)] == want["input_ids"]
    assert [list(r[:n]) for r, n in zip(got.types, got.lengths)] == want["token_type_ids"]
    assert got.lengths.max() == 24 and (got.ids[got.attention_mask() == 0] == enc.tokenizer.pad_token_id).all()
    assert after == before


@pytest.mark.parametrize("pooler", ["mean", "mask"])
def test_a_cpu_vector_does_not_depend_on_its_batch_or_chunk(threaded, pooler):
    """The CPU's promise, through threads and chunks: a row alone = in a batch of 7 = of 64 = of 512 (the largest
    same-length batch here), bit for bit; and the whole input equals encoding each text alone."""
    from tiny_bert import tiny_encoder

    enc = tiny_encoder(pooler=pooler, max_length=32)
    texts = WIKI[:150] + ODD
    ref = enc.encode(texts, batch_size=128)
    for rows in (7, 64, 512):
        assert np.array_equal(enc.encode(texts, batch_size=rows), ref), rows
    alone = np.concatenate([enc.encode([t]) for t in texts[::17]])
    assert np.array_equal(alone, ref[::17])


def test_same_length_batches_cut_each_length_in_input_order():
    """Each length's rows in input order, cut every `rows` rows as the bucket fills (the old whole-input sort gave
    the same batches), small batches repeating their rows up to MIN_ROWS rows and MIN_TOKENS tokens."""
    from contramine.pipeline.models.encode.batches import MIN_ROWS, MIN_TOKENS, Tokens, same_length_batches

    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 9, 500)
    ids = np.where(np.arange(8) < lengths[:, None], np.arange(500)[:, None] * 10 + np.arange(8), 0)
    chunks = [Tokens(np.arange(s, s + 50), lengths[s:s + 50], ids[s:s + 50], None) for s in range(0, 500, 50)]
    seen = []
    for b in same_length_batches(chunks, rows=16):
        length = int(b.lengths[0])
        assert (b.lengths == length).all() and b.ids.shape[1] == length
        assert len(b.rows) == max(b.real, MIN_ROWS, -(-MIN_TOKENS // length))
        assert (b.rows[b.real:] == np.resize(b.rows[:b.real], len(b.rows) - b.real)).all()  # repeats only
        assert (b.ids[:, 0] == b.rows * 10).all()  # each row's own ids
        seen.append((length, b.rows[:b.real].tolist()))
    want = []
    for length in np.unique(lengths):
        rows = np.flatnonzero(lengths == length).tolist()
        want += [(int(length), rows[i:i + 16]) for i in range(0, len(rows), 16)]
    assert sorted(seen) == sorted(want)


def test_packed_batches_fill_the_token_budget():
    """A GPU's batches: every row once, longest first, rows x padded length within the budget (a longer row
    alone), and all but the last few full."""
    from contramine.pipeline.models.encode.batches import Tokens, packed_batches

    rng = np.random.default_rng(1)
    lengths = np.r_[rng.integers(3, 40, 3000), 300]
    width = int(lengths.max())
    ids = np.where(np.arange(width) < lengths[:, None], 7, 0)
    chunks = [Tokens(np.arange(s, min(s + 256, len(lengths))), lengths[s:s + 256], ids[s:s + 256], None)
              for s in range(0, len(lengths), 256)]
    batches = list(packed_batches(chunks, tokens=1024))
    rows = np.concatenate([b.rows for b in batches])
    assert sorted(rows.tolist()) == list(range(len(lengths)))
    for b in batches:
        assert (np.diff(b.lengths) <= 0).all() and b.ids.shape[1] == b.lengths[0]
        assert len(b.rows) * b.ids.shape[1] <= 1024 or len(b.rows) == 1
    full = [len(b.rows) * b.ids.shape[1] > 1024 - b.ids.shape[1] for b in batches]
    assert sum(not f for f in full) <= 2 and len(batches) < 1.1 * lengths.sum() / 1024 + 2


def test_gpu_rules_on_cpu_tensors(threaded):
    """The GPU path's logic, run on this CPU (`_encode(kind="cuda")`): merged-length batches give the same vectors
    to float32 rounding, in input order; bf16 holds a copy of the weights in bf16, cast once and kept while the
    weights are unchanged, leaving the float32 model alone; pooling and normalising stay float32."""
    from tiny_bert import tiny_encoder

    enc = tiny_encoder(pooler="mean", max_length=32).eval()
    texts = WIKI[:200] + ODD
    ref = enc.encode(texts)
    with torch.inference_mode():
        gpu = enc._encode(texts, 128, True, False, None, 512, "cuda")
    np.testing.assert_allclose(gpu, ref, atol=1e-6)
    enc.precision = "bf16"
    with torch.inference_mode():
        low = enc._encode(texts, 128, True, False, None, 512, "cuda")
        held = enc._cache["held"][1]
        again = enc._encode(texts, 128, True, False, None, 512, "cuda")
    assert enc._cache["held"][1] is held and np.array_equal(low, again)  # cast once, reused
    assert {p.dtype for p in held.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in enc.model.parameters()} == {torch.float32}
    assert low.dtype == np.float32 and np.allclose(np.linalg.norm(low, axis=1), 1, atol=1e-6)
    assert not np.array_equal(low, ref) and np.abs(low - ref).max() < 5e-2
    with torch.no_grad():  # an optimiser step: the held copy is cast again
        enc.model.embeddings.word_embeddings.weight.mul_(2.0)
    with torch.inference_mode():
        moved = enc._encode(texts, 128, True, False, None, 512, "cuda")
    assert enc._cache["held"][1] is not held and not np.array_equal(moved, low)


def test_a_training_encoder_keeps_no_held_copy():
    """A model in training changes its weights: encode's bf16 copy is dropped when the encode ends, and the model
    is back in training mode."""
    from tiny_bert import tiny_encoder

    enc = tiny_encoder(pooler="cls", max_length=32, dropout=0.1).train()
    enc.precision = "bf16"
    with torch.inference_mode():
        enc._encode(TEXTS, 128, True, False, None, 512, "cuda")
    assert enc.training and "held" not in enc._cache


def test_tokenising_errors_reach_the_caller_and_stop_the_threads(threaded, monkeypatch):
    """An error in a tokenising thread is raised by encode; the threads stop after at most the chunks in flight."""
    from tiny_bert import tiny_encoder

    enc = tiny_encoder(pooler="mean")
    calls = []
    real = enc._token_arrays

    def failing(rows, texts, template, max_length):
        calls.append(rows[0])
        if rows[0] >= 37:
            raise RuntimeError("tokenizer broke")
        return real(rows, texts, template, max_length)

    monkeypatch.setattr(enc, "_token_arrays", failing)
    with pytest.raises(RuntimeError, match="tokenizer broke"):
        enc.encode(WIKI * 10)
    time.sleep(0.2)
    assert len(calls) <= 1 + 2 * 2 + 1  # the chunk that failed, the ones in flight: not all 81 chunks


def test_a_gpus_batches_are_queued_without_reading_the_device(threaded, monkeypatch):
    """Under a GPU's rules (merged lengths, padded batches) the model gets its attention mask as the host decided
    it (none for a batch without padding, else the 4-D mask): transformers' check of the mask, a device read per
    batch, never runs, so the host queues the next batch while the card runs this one; the only reads left are the
    vectors' copy back (one per FLUSH_ROWS rows). The vectors are those of the 2-D mask's path, bit for bit."""
    import transformers.masking_utils as masking

    from tests.host_reads import HostReads
    from tiny_bert import tiny_encoder

    enc = tiny_encoder(pooler="mean", max_length=32).eval()
    texts = WIKI[:300] + ODD
    checks = []
    check = masking._ignore_bidirectional_mask_sdpa
    monkeypatch.setattr(masking, "_ignore_bidirectional_mask_sdpa",  # a mask to check: a read of the device
                        lambda mask, *a, **k: (mask is None or checks.append(1), check(mask, *a, **k))[1])
    with torch.inference_mode(), HostReads() as reads:
        queued = enc._encode(texts, 128, True, False, None, 256, "cuda")
    assert checks == [] and reads.count <= 2, reads.where  # the flush: .cpu() and .numpy()
    monkeypatch.setattr("contramine.pipeline.models.encode.encoder.HOST_MASKED_TYPES", frozenset())
    with torch.inference_mode():
        checked = enc._encode(texts, 128, True, False, None, 256, "cuda")
    assert len(checks) > 5 and np.array_equal(queued, checked)
