"""The host bench's hollow models (bench/host/jobs.py times the jobs with them): each model's arithmetic removed,
its call structure kept, the same on both checkouts. The feature width is cut to WIDTH, so no op has arithmetic to
speak of on this CPU, while the batch and sequence shapes stay the jobs' own:
- HollowBert: bert-base's `model(**batch)` (config: model_type "bert", so the trainer's padding-free path runs as on
  the real model). Its output is a lookup of [B, L, WIDTH]; and every call runs a real 12-layer BertModel of width
  4 on one token, so the model's own Python and op dispatch (~ its kernel launches) is paid per call, as on a GPU,
  with no arithmetic. Gradients reach every weight of both: the optimiser steps over ~200 tensors, as for
  bert-base.
- HollowMarian: a real MarianMTModel of opus-mt's layout (6 + 6 layers, Marian's tokenizer and generation config)
  at width 4 and a 64-entry output vocabulary, so HF `generate` runs its real per-step decoder, cache and logits
  processors; the encoder pass is hollow like HollowBert's. Each row emits a translation's length
  (target_lengths: 0.8-1.3x its source's tokens, its last one eos), and one row in 23 never stops by itself and runs
  to its cap (a degenerate output; the Translator forces its eos there). Under our decode loop (a checkout that has
  pipeline/models/translate/decode/loop.py) HollowSteps decodes the same rows through the loop's real per-step layer calls.
- HollowIndex: TorchExact's part on the card (the score GEMM and the top-k) done before the clock starts: `search`
  returns the exact top-k of the queries from a table computed once with TorchExact, found by a key of each
  query's first coordinates (bench/host/bench.py builds it); a k past the table is searched exactly in numpy.
"""
from __future__ import annotations

WIDTH = 8  # the hollow models' output width (bert-base: 768): pooling, normalising, BatchNorm, cosines stay cheap
THIN = 4  # width of the real layers run on one token (the models' own dispatch) and of the hollow Marian
MARIAN_VOCAB = 64  # the hollow Marian's output vocabulary (opus-mt: 58,101): logits processors over 64 columns


def hollow_bert(vocab_size: int, dropout: float = 0.1, layers: int = 12):
    """HollowBert (module docstring) for a tokenizer of `vocab_size` entries."""
    import torch
    from transformers import BertConfig, BertModel, BertPreTrainedModel
    from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions

    counter = [0]  # forward calls, shared with copies (a GPU's encode holds a bf16 copy of the model)

    class HollowBert(BertPreTrainedModel):
        calls = property(lambda self: counter[0], lambda self, n: counter.__setitem__(0, n))

        def __init__(self, config: BertConfig):
            super().__init__(config)
            thin = BertConfig(vocab_size=8, hidden_size=THIN, num_hidden_layers=config.num_hidden_layers,
                              num_attention_heads=1, intermediate_size=THIN, hidden_dropout_prob=dropout,
                              attention_probs_dropout_prob=dropout)
            self.shadow = BertModel(thin, add_pooling_layer=True)  # real layers, run on one token per call
            self.table = torch.nn.Embedding(config.vocab_size, config.hidden_size)
            self.register_buffer("one_token", torch.ones((1, 1), dtype=torch.long), persistent=False)
            self.calls = 0
            self.post_init()

        def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                    output_hidden_states=False, return_dict=True, **kwargs):
            self.calls += 1
            shadow = self.shadow(input_ids=self.one_token).pooler_output  # the model's dispatch, no arithmetic
            last = self.table(input_ids) + shadow.mean()
            hidden = (last,) * (self.config.num_hidden_layers + 1) if output_hidden_states else None
            return BaseModelOutputWithPoolingAndCrossAttentions(last_hidden_state=last, pooler_output=last[:, 0],
                                                               hidden_states=hidden)

    config = BertConfig(vocab_size=vocab_size, hidden_size=WIDTH, num_hidden_layers=layers, num_attention_heads=1,
                        intermediate_size=WIDTH, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return HollowBert(config)


def target_lengths(source_tokens):
    """Tokens each row of the hollow Marian emits, its eos included: a translation's length (0.8-1.3x the source's
    tokens, spread by the length), or "never stops" (a huge number: the row's cap ends it) for one row in 23."""
    import torch

    n = torch.ceil(source_tokens * (0.8 + 0.05 * (source_tokens * 7 % 11))).long()
    return torch.where(source_tokens % 23 == 0, 10**6, n)


def hollow_steps(model):
    """The decode loop's steps (pipeline/models/translate/decode/steps.py) for a HollowMarian, hollow as HollowBert is: the
    real thin decoder layers run on one row a step (the loop's own per-step dispatch: its layer calls, K/V writes
    and attention, as a GPU launches them), and every row's token is the hollow model's (words, then eos at its
    length). The loop's per-row work outside the model (processors, argmax, finished rows, drops) runs on every
    row."""
    import torch

    from contramine.pipeline.models.translate.decode.steps import Seq2SeqSteps, StepState

    class HollowSteps(Seq2SeqSteps):
        def start(self, input_ids, attention_mask, n_tokens, *banned):  # (banned: a checkout whose loop passes it)
            self.thin = super().start(input_ids[:1], attention_mask[:1], n_tokens, *banned)  # one row's layers, caches
            return StepState(attention_mask.bool()[:, None, None, :1], [], [], [], [],
                             {"due": target_lengths(attention_mask.sum(1)) - 1})  # the step whose token is eos

        def advance(self, state, tokens, t):
            # the layers' dispatch, as the loop calls it (a checkout from before `advance`: `step`); values unused
            (getattr(super(), "advance", None) or super().step)(self.thin, tokens[:1], t)
            return torch.where((state.rows["due"] <= t)[:, None], model.eos_logits,
                               model.words[t % len(model.words)])

        step = advance  # what a checkout's loop calls: `advance` now, `step` before

    return HollowSteps(model)


def hollow_marian(pad_id: int, eos_id: int, layers: int = 6):
    """HollowMarian (module docstring): token ids pad_id / eos_id as the tokenizer has them (both < MARIAN_VOCAB)."""
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel
    from transformers.modeling_outputs import BaseModelOutput

    class HollowEncoder(torch.nn.Module):
        """The encoder pass: the real (thin) encoder run on one token, its output spread to [B, S, d]."""

        main_input_name = "input_ids"

        def __init__(self, real):
            super().__init__()
            self.real = real
            self.register_buffer("one_token", torch.full((1, 1), eos_id, dtype=torch.long), persistent=False)

        def get_input_embeddings(self):
            return self.real.get_input_embeddings()

        def forward(self, input_ids=None, attention_mask=None, **kwargs):
            self.owner.decode_step = 0  # generate runs the encoder once per batch, then decodes: step 0 next
            h = self.real(input_ids=self.one_token, return_dict=True).last_hidden_state
            return BaseModelOutput(last_hidden_state=h.expand(input_ids.shape[0], input_ids.shape[1], -1))

    class HollowMarian(MarianMTModel):
        def forward(self, *args, attention_mask=None, **kwargs):
            out = super().forward(*args, attention_mask=attention_mask, **kwargs)
            step, self.decode_step, self.steps = self.decode_step, self.decode_step + 1, self.steps + 1
            # content tokens until the row's length (target_lengths), then eos; the row's own length limit, forced
            # by the Translator, ends the rows that never stop
            due = target_lengths(attention_mask.sum(1)) - 1 <= step
            out.logits = torch.where(due[:, None, None], self.eos_logits, self.words[step % len(self.words)])
            return out

    config = MarianConfig(vocab_size=MARIAN_VOCAB, decoder_vocab_size=MARIAN_VOCAB, d_model=THIN,
                          encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=1,
                          decoder_attention_heads=1, encoder_ffn_dim=THIN, decoder_ffn_dim=THIN, pad_token_id=pad_id,
                          eos_token_id=eos_id, decoder_start_token_id=pad_id, forced_eos_token_id=eos_id,
                          max_position_embeddings=512, activation_function="swish", scale_embedding=True,
                          share_encoder_decoder_embeddings=True, dropout=0.1, attention_dropout=0.0,
                          activation_dropout=0.0)
    model = HollowMarian(config)
    model.model.encoder = HollowEncoder(model.model.encoder)
    object.__setattr__(model.model.encoder, "owner", model)  # not a submodule: no cycle in the module tree
    words = [i for i in range(MARIAN_VOCAB) if i not in (pad_id, eos_id) and i > 2]
    model.register_buffer("words", torch.nn.functional.one_hot(torch.tensor(words), MARIAN_VOCAB).float() * 10,
                          persistent=False)
    model.register_buffer("eos_logits", torch.nn.functional.one_hot(torch.tensor(eos_id), MARIAN_VOCAB).float() * 10,
                          persistent=False)
    model.decode_step = model.steps = 0
    model.generation_config = GenerationConfig(decoder_start_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id,
                                               bad_words_ids=[[pad_id]], num_beams=1, do_sample=False)
    return model.eval()


class HollowIndex:
    """HollowIndex (module docstring): `search(x, k)` like TorchExact's, from the exact table D, I of `base`."""

    def __init__(self, base, D, I):
        import numpy as np

        self.base, self.D, self.I = base, D, I
        keys = self.key(base)
        self.order = np.argsort(keys, kind="stable")
        self.sorted_keys = keys[self.order]
        if len(keys) and (self.sorted_keys[1:] == self.sorted_keys[:-1]).any():
            raise ValueError("HollowIndex: two base rows share their first two coordinates; draw the vectors again")

    @staticmethod
    def key(x):
        import numpy as np

        return np.ascontiguousarray(x[:, :2], dtype=np.float32).view(np.int64).ravel()

    def search(self, x, k: int):
        import numpy as np

        x = np.ascontiguousarray(x, dtype=np.float32)
        rows = self.order[np.searchsorted(self.sorted_keys, self.key(x))]
        if k <= self.D.shape[1]:
            return self.D[rows, :k], self.I[rows, :k]
        n = len(self.base)  # wider than the table (a query whose pool needs more): exact, in numpy
        scores = x @ self.base.T
        idx = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # descending, ties by ascending row: TorchExact's
        D = np.full((len(x), k), np.finfo(np.float32).min, dtype=np.float32)
        I = np.full((len(x), k), -1, dtype=np.int64)
        D[:, :min(k, n)] = np.take_along_axis(scores, idx, axis=1)
        I[:, :min(k, n)] = idx
        return D, I
