"""The host bench (bench/host/bench.py, bench/host/jobs.py) times the GPU jobs with their arithmetic removed; what it
times must still be the job: the hollow index gives the band search's exact pools, the hollow Marian goes through
HF generate and our decode loop and ends each row at a translation's length, the hollow BERT takes the trainer's padding-free
path and passes gradients to every weight. The base side is a git export of a commit, and a setting reaches the
side it names. (`make bench`'s smoke run of the whole bench is in tests/test_bench_modules.py.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.host.bench import _bert_tokenizer, _marian_tokenizer, export_base, side_settings
from bench.host.hollow import WIDTH, HollowIndex, hollow_bert, hollow_marian
from bench.fixtures.shapes import sentences


def test_the_hollow_index_answers_as_torchexact_and_gives_the_exact_band_pools():
    from bench.gpu.sections import topic_vectors
    from contramine.pipeline.search.band import band_neighbours, exact_band_neighbours
    from contramine.pipeline.search.torch_exact import TorchExact

    x = topic_vectors(600, 384, per_topic=150, seed=2)  # large topics: many pools need a search wider than the table
    exact = TorchExact(x)
    D, I = exact.search(x, 100)
    hollow = HollowIndex(x, D, I)
    for k in (89, 250):  # from the table; past it (numpy)
        hd, hi = hollow.search(x[::7], k)
        ed, ei = exact.search(x[::7], k)
        assert np.array_equal(hi, ei) and np.allclose(hd, ed, atol=1e-5)
    sids = np.arange(len(x), dtype=np.int64) * 3 + 1
    got = band_neighbours(x, sids, x, sids, hollow, hollow, 0.25, 0.75, 64)
    ref = exact_band_neighbours(x, sids, x, sids, 0.25, 0.75, 64)
    assert got.num_rows == ref.num_rows > 0
    for key in ("sid", "cand_sid", "rank"):
        assert got.column(key).equals(ref.column(key))


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from transformers import AutoTokenizer

    folder, lines = tmp_path_factory.mktemp("host-bench"), sentences(400)
    _bert_tokenizer(folder / "bert", lines)
    _marian_tokenizer(folder / "marian", lines, 400)
    return AutoTokenizer.from_pretrained(folder / "bert"), AutoTokenizer.from_pretrained(folder / "marian")


def test_the_hollow_marian_emits_a_translations_length_through_generate_and_our_loop(tokenizers):
    """Each row emits target_lengths' tokens (0.8-1.3x its source's, eos last; one length in 23 never stops and
    runs to its cap), under HF generate and under our decode loop (HollowSteps): the same texts both ways."""
    from bench.host.hollow import hollow_steps, target_lengths
    from contramine.pipeline.config.backtranslation import BacktranslateCfg
    from contramine.pipeline.models.translate.engines.hf import Translator

    n = torch.arange(1, 200)
    want = target_lengths(n)
    runaway = n % 23 == 0
    assert bool((want[runaway] >= 10**6).all()) and bool((want[~runaway] >= (0.8 * n[~runaway]).ceil()).all())
    assert bool((want[~runaway] <= (1.3 * n[~runaway]).ceil()).all()) and len(set((want / n)[~runaway].tolist())) > 5
    tok = tokenizers[1]
    model = hollow_marian(tok.pad_token_id, tok.eos_token_id)
    texts = sentences(40, skip=100)
    n_src = torch.tensor([len(ids) for ids in tok(texts)["input_ids"]])  # each ends with </s>
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        seqs = model.generate(**batch, max_new_tokens=200)[:, 1:]  # without the decoder start
    made = [(row != tok.pad_token_id).sum().item() for row in seqs]
    assert made == target_lengths(n_src).clamp_max(200).tolist()  # content tokens, then eos at the length
    outs = {}
    for decoder in ("generate", "loop"):
        tr = Translator("Helsinki-NLP/opus-mt-en-de", tok, model, BacktranslateCfg(decoder=decoder), "cpu")
        if decoder == "loop":
            tr.loop.steps_model = hollow_steps(model)
        outs[decoder] = tr.translate(texts)
    assert outs["loop"] == outs["generate"] and all(o[0] for o in outs["loop"])


def test_the_hollow_bert_takes_the_padding_free_path_and_trains_every_weight(tokenizers):
    from contramine.pipeline.models.encode.encoder import Encoder
    from contramine.pipeline.models.encode.unpad import can_unpad

    tok = tokenizers[0]
    model = hollow_bert(len(tok))
    enc = Encoder(model, tok, pooler="cls_before_pooler", max_length=32)
    enc.unpad = True
    batch = enc.tokenize(sentences(8, skip=50))
    assert can_unpad(model, batch["attention_mask"])
    enc(batch).sum().backward()
    assert model.calls == 1
    params = list(model.named_parameters())
    assert len(params) > 190  # bert-base's ~200 tensors: the optimiser's work per step is as for the real model
    assert [n for n, p in params if p.grad is None] == []
    vecs = enc.encode(sentences(20, skip=10), batch_size=8)
    assert vecs.shape == (20, WIDTH) and np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-5)


def test_the_base_is_a_git_export_and_a_setting_reaches_its_side(tmp_path):
    base = export_base("HEAD", tmp_path)
    assert (base / "pipeline" / "models" / "encode" / "encoder.py").is_file() and not (base / ".git").exists()
    with pytest.raises(SystemExit, match="cannot export commit 'no-such-commit'"):
        export_base("no-such-commit", tmp_path / "x")
    items = ["new:generate.batch_size=64", "encode.batch_size=256", "base:train.unpad=false"]
    assert side_settings(items, "base") == ["encode.batch_size=256", "train.unpad=false"]
    assert side_settings(items, "new") == ["generate.batch_size=64", "encode.batch_size=256"]
