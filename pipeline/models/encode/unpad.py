"""Padding-free ("unpadded") forward for BERT-family encoders: the same outputs, no arithmetic on pad tokens.

A training batch is padded to its longest row; on the default run's wiki sentences (max_length 32, random batches
of 64) 28% of the tokens are padding. Every linear layer (Q/K/V, attention output, both FFN matrices: about 80% of
a training step on CPU) works token by token, so it can run on the real tokens only. This module does that with the
model's own modules and weights:

  1. pack:   the batch's real tokens become one row of T tokens; position ids and token types come along, so the
             embeddings are those of the padded batch (absolute positions for BERT, padding_idx + 1 + position
             for RoBERTa/XLM-R, as their embeddings compute them);
  2. layers: the model runs on [1, T, H] with `unpadded_attention` as its attention function. Attention is the one
             step that mixes tokens: it scatters Q, K and V back to [B, heads, L, d], runs SDPA with the key padding
             mask (what the padded model runs), and gathers the real rows again;
  3. unpack: the last (and, for avg_first_last, the first) hidden states are scattered back to [B, L, H] with
             zeros at the pads, so `pipeline.encoder.pool` pools them exactly as before.

With dropout off, outputs equal the padded model's up to float summation order (tests/test_unpad.py); in training,
dropout draws its masks over the real tokens only, so the random masks differ but follow the same distribution.
Architectures outside UNPADDED_MODEL_TYPES, relative position embeddings, decoders and left-padded batches fall back
to the padded forward (`can_unpad` says which).

Where the layout comes from: finding the real tokens (nonzero over the mask, the right-padding check) reads the mask
on the host. In training the objectives' collate makes it (`unpad_layout`, in the DataLoader workers) and the batch
carries it, so the forward on a GPU never waits for the device to say where the tokens are; inference batches and
the sentence-transformers losses, which carry none, have it made in the forward.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

UNPADDED_ATTENTION = "contramine_unpadded"
# model_type -> how its embeddings number positions (see packed_position_ids)
UNPADDED_MODEL_TYPES = {"bert": "absolute", "roberta": "after_padding_idx", "xlm-roberta": "after_padding_idx",
                        "camembert": "after_padding_idx"}


def unpadded_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                       unpad_index: torch.Tensor | None = None, unpad_key_mask: torch.Tensor | None = None,
                       **kwargs):
    """HF attention function over packed tokens. query/key/value: [1, heads, T, d] for the T real tokens of a
    batch whose key padding mask is `unpad_key_mask` [B, 1, 1, L] and whose flat (row * L + column) positions are
    `unpad_index`. Returns ([1, T, heads, d], None), the layout HF's attention functions return."""
    if unpad_index is None:
        raise RuntimeError(f"attention {UNPADDED_ATTENTION!r} runs only inside pipeline.unpad.unpadded_forward")
    b, length = unpad_key_mask.shape[0], unpad_key_mask.shape[-1]  # type: ignore[union-attr]  # given with unpad_index
    heads, d = query.shape[1], query.shape[-1]

    def pad(x):  # [1, heads, T, d] -> [B, heads, L, d], zeros at the pads
        flat = x.new_zeros(b * length, heads, d).index_copy(0, unpad_index, x[0].transpose(0, 1))
        return flat.view(b, length, heads, d).transpose(1, 2)

    # every query attends to its own row's real tokens only, as in the padded model
    out = F.scaled_dot_product_attention(pad(query), pad(key), pad(value), attn_mask=unpad_key_mask,
                                         dropout_p=dropout, scale=scaling)
    out = out.transpose(1, 2).reshape(b * length, heads, d).index_select(0, unpad_index)
    return out.unsqueeze(0), None


AttentionInterface.register(UNPADDED_ATTENTION, unpadded_attention)


def unpaddable_model(model) -> bool:
    """Whether this architecture has a padding-free forward here (read from its config: no tensor is touched)."""
    cfg = model.config
    if UNPADDED_MODEL_TYPES.get(cfg.model_type) is None or getattr(cfg, "is_decoder", False):
        return False
    return getattr(cfg, "position_embedding_type", "absolute") == "absolute"


# The keys `unpad_layout` adds to a batch (and Encoder.forward takes out of it before the model sees it).
LAYOUT_KEYS = ("unpad_index", "unpad_positions")


def unpad_layout(model, attention_mask: torch.Tensor) -> dict | None:
    """The packed layout of a batch: {"unpad_index": the flat (row * L + column) position of every real token [T],
    "unpad_positions": its position id, numbered as the model's embeddings number it in the padded batch [T]}; None
    where the padding-free forward would not give the padded model's outputs (another architecture, left padding,
    a row without tokens).

    It reads the mask (nonzero, comparisons): the training collate calls it on the host, in the DataLoader workers,
    and the batch carries the result to the device, so a training forward reads nothing back from the device. A
    batch without it (inference, the sentence-transformers losses) has it computed in the forward instead."""
    if not unpaddable_model(model):
        return None
    lengths = attention_mask.sum(1)
    columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    right_padded = bool(torch.equal(attention_mask.bool(), columns < lengths[:, None]))
    if not (right_padded and bool((lengths > 0).all())):
        return None
    return {"unpad_index": attention_mask.reshape(-1).nonzero().squeeze(1),
            "unpad_positions": packed_position_ids(model, attention_mask)}


def can_unpad(model, attention_mask: torch.Tensor) -> bool:
    """True when the padding-free forward gives this model's padded outputs for this batch and saves work."""
    return unpad_layout(model, attention_mask) is not None and int(attention_mask.sum()) < attention_mask.numel()


def packed_position_ids(model, attention_mask: torch.Tensor) -> torch.Tensor:
    """Position id of every real token, numbered as the model's embeddings number them in the padded batch."""
    columns = torch.arange(attention_mask.shape[1], device=attention_mask.device).expand_as(attention_mask)
    if UNPADDED_MODEL_TYPES[model.config.model_type] == "after_padding_idx":
        columns = columns + model.config.pad_token_id + 1  # right padding: cumsum(mask) - 1 == column
    return columns[attention_mask.bool()]


def unpadded_forward(model, batch: dict, output_hidden_states: bool = False, output_pooler: bool = False,
                     layout: dict | None = None) -> SimpleNamespace:
    """model(**batch) without arithmetic on pads; returns last_hidden_state [B, L, H] (zeros at pads) and, if asked,
    hidden_states in the padded layout and pooler_output (the model's pooler on the padded layout; the one the model
    computes itself sees the packed row, so it is never used). `layout`: the batch's `unpad_layout`, made on the host
    by the caller (then nothing here waits for the device); computed from the mask when absent."""
    mask = batch["attention_mask"]
    b, length = mask.shape
    if layout is None:
        layout = {"unpad_index": mask.reshape(-1).nonzero().squeeze(1),
                  "unpad_positions": packed_position_ids(model, mask)}
    unpad_index = layout["unpad_index"]
    token_types = batch.get("token_type_ids")
    packed = {
        "input_ids": batch["input_ids"].reshape(-1)[unpad_index][None],
        "position_ids": layout["unpad_positions"][None],
        "token_type_ids": None if token_types is None else token_types.reshape(-1)[unpad_index][None],
    }
    cfg = model.config
    previous = cfg._attn_implementation
    cfg._attn_implementation = UNPADDED_ATTENTION  # read by every layer at call time; restored below
    try:
        out = model(**packed, unpad_index=unpad_index, unpad_key_mask=mask.bool().view(b, 1, 1, length),
                    output_hidden_states=output_hidden_states, return_dict=True)
    finally:
        cfg._attn_implementation = previous

    def unpack(h):  # [1, T, H] -> [B, L, H]
        return h.new_zeros(b * length, h.shape[-1]).index_copy(0, unpad_index, h[0]).view(b, length, -1)

    last = unpack(out.last_hidden_state)
    pooler = getattr(model, "pooler", None)
    return SimpleNamespace(
        last_hidden_state=last,
        pooler_output=pooler(last) if output_pooler and pooler is not None else None,
        hidden_states=tuple(unpack(h) for h in out.hidden_states) if output_hidden_states else None,
    )
