"""The shared encoder loads any HF encoder architecture: the BERT pooler where the model class takes one, plain
models (ELECTRA, DistilBERT) where it does not — decided from the constructor, not from a list of model types."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import BertTokenizerFast, DistilBertConfig, DistilBertModel, ElectraConfig, ElectraModel

from pipeline.models.encoder import Encoder, _takes_pooling_layer
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
