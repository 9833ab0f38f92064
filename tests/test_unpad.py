"""The padding-free forward (pipeline/unpad.py) gives the padded model's pooled vectors and gradients, for BERT and
RoBERTa numbering of positions, every pooler, token types, and falls back where it cannot be exact."""
from __future__ import annotations

import pytest
import torch
from transformers import BertModel, RobertaConfig, RobertaModel

from contramine.pipeline.models.encode.encoder import POOLERS, Encoder
from contramine.pipeline.models.encode.unpad import can_unpad, unpadded_forward
from tiny_bert import tiny_config, tiny_encoder

TEXTS = ["a man is playing the guitar", "dogs run", "the old city has a river and a big park with many people",
         "a child eats", "two women ride horses on the road after school"]


def roberta_encoder(pooler: str) -> Encoder:
    """A tiny random RoBERTa over the tiny BERT tokenizer: its positions start after padding_idx (= the pad id)."""
    bert = tiny_encoder(pooler)
    conf = tiny_config(len(bert.tokenizer)).to_dict()
    conf.update(pad_token_id=bert.tokenizer.pad_token_id, max_position_embeddings=130, type_vocab_size=1,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(1)
    model = RobertaModel(RobertaConfig(**{k: v for k, v in conf.items() if k != "model_type"}))
    return Encoder(model, bert.tokenizer, pooler, 32).eval()


def both_ways(enc: Encoder, batch: dict) -> tuple:
    """Pooled vectors and parameter gradients (of a fixed random projection of them), padded then unpadded."""
    w = torch.randn(enc.dim, generator=torch.Generator().manual_seed(0))
    results = []
    for unpad in (False, True):
        enc.unpad = unpad
        enc.zero_grad()
        out = enc(batch)
        (out @ w).square().sum().backward()
        results.append((out.detach(), {n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None}))
    return results


@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize("pooler", POOLERS)
def test_unpadded_equals_padded(family, pooler):
    enc = tiny_encoder(pooler) if family == "bert" else roberta_encoder(pooler)
    batch = enc.tokenize(TEXTS)
    if family == "bert":  # token types must follow their tokens into the packed row
        batch["token_type_ids"] = (torch.arange(batch["input_ids"].shape[1]) % 3 == 0).long().expand_as(
            batch["input_ids"]).contiguous()
    lengths = batch["attention_mask"].sum(1)
    assert lengths.min() < lengths.max() and can_unpad(enc.model, batch["attention_mask"])
    (padded, g_padded), (unpadded, g_unpadded) = both_ways(enc, batch)
    torch.testing.assert_close(unpadded, padded, rtol=1e-5, atol=1e-6)
    assert set(g_unpadded) == set(g_padded) and g_padded
    for name, g in g_padded.items():
        torch.testing.assert_close(g_unpadded[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_rows_do_not_see_each_other_and_dropout_is_seeded():
    """Packed rows share one sequence: a row's vector must not change with its neighbour (dropout off), and in
    training the dropout masks come from torch's generator (same seed, same vectors; another seed, others)."""
    enc = tiny_encoder("mean", dropout=0.1).eval()
    enc.unpad = True
    a, b = (enc(enc.tokenize([TEXTS[0], other]))[0] for other in ("dogs run", TEXTS[2]))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    enc.train()
    batch = enc.tokenize(TEXTS)
    runs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        runs.append(enc(batch))
    torch.testing.assert_close(runs[0], runs[1])
    assert (runs[0] - runs[2]).abs().max() > 1e-4


def test_falls_back_where_it_cannot_be_exact():
    enc = tiny_encoder("mean")
    batch = enc.tokenize(TEXTS)
    mask = batch["attention_mask"]
    assert can_unpad(enc.model, mask)
    assert not can_unpad(enc.model, mask.flip(1))  # left padding
    assert not can_unpad(enc.model, torch.ones_like(mask))  # nothing to skip
    conf = tiny_config(len(enc.tokenizer))
    conf.position_embedding_type = "relative_key"
    relative = BertModel(conf)
    assert not can_unpad(relative, mask)
    # the encoder then runs the padded forward and gives its result
    left = {k: v.flip(1) for k, v in batch.items()}
    enc.unpad = False
    want = enc(left)
    enc.unpad = True
    torch.testing.assert_close(enc(left), want)


def test_attention_setting_restored_even_on_error():
    enc = tiny_encoder("mean")
    batch = enc.tokenize(TEXTS)
    before = enc.model.config._attn_implementation
    bad = {**batch, "input_ids": batch["input_ids"] + 10_000}  # past the vocabulary: the embedding lookup fails
    with pytest.raises(IndexError):
        unpadded_forward(enc.model, bad)
    assert enc.model.config._attn_implementation == before
    enc.unpad = False
    assert torch.isfinite(enc(batch)).all()  # the padded path still runs with the model's own attention
