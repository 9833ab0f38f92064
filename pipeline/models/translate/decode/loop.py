"""The HF engine's own decoding loop for Marian and FSMT models: what `model.generate` returns, token for token on a
CPU, with the device read back once every `check_every` steps instead of ~3 times a step.

    loop = DecodeLoop(model)                  # supports(model) says whether it knows the architecture
    seqs = loop.generate(input_ids, attention_mask, generation_config, logits_processors)

`generate` takes what engines/hf.py hands `model.generate` and returns the same sequences (start token first, pad
after eos; trailing pad columns may differ, which decoding skips). It builds transformers' own logits processors
for that generation config (so the scores are processed exactly as generate processes them: banned words, forced
bos / eos, then ours), then decodes greedily (engines/hf.py samples as greedy over Gumbel-perturbed scores) or by
beam search (decode/beam.py, transformers' vectorised beam search step by step). Per batch (decode/steps.py) the
encoder and cross-attention K/V are computed once and the self-attention K/V are preallocated.

Greedy's logits (decode/steps.py): where every processor is one this loop can express (greedy_plan), the banned
tokens are -inf in the output bias, the argmax runs over the model's dtype (no float32 copy of rows x vocabulary),
and forced tokens (forced bos / eos, each row's length limit) are written into the argmax's result afterwards: the
same token as the argmax of the forced scores (-inf but for the forced token), without a pass over them. Sampling's
Gumbel noise still runs on float32 scores, as in generate; beam search keeps every processor (its scores are
log-probabilities: a ban before the softmax would change the others).

Host reads: the next token is chosen on the device; the "which rows are done" flags are copied back (non-blocking
into pinned memory on a GPU) every `check_every` steps and read one step later, when the device already has the
next step queued. On a CPU a read waits for nothing (`free_reads`, the default there): the greedy loop also looks at
the flags' memory every step and stops at the step its last row ends, as generate does, not up to `check_every`
steps later (rows are still dropped every `check_every` steps: a drop costs a copy of every cache). Finished rows
(greedy) or inputs whose beams are settled (beam) are then dropped from the batch:
their sequences are stored and every per-row tensor, cache and logits processor keeps the rest. A row's tokens do
not depend on when its batch-mates are dropped (each row's arithmetic is its own; tests/test_decode_loop.py).
torch.compile / CUDA graphs are not used: the batch shrinks as rows finish (a new shape every drop) and nothing
measured them on a GPU yet.
"""
from __future__ import annotations

import torch
from transformers import (ForcedBOSTokenLogitsProcessor, ForcedEOSTokenLogitsProcessor, LogitsProcessorList,
                          NoBadWordsLogitsProcessor)

from contramine.pipeline.models.translate.decode.beam import beam_search
from contramine.pipeline.models.translate.decode.steps import (KNOWN_TYPES, CheckedProcessors, DoneFlags, Seq2SeqSteps,
                                                               device_rows, subset_processors, supports, token_ids)

__all__ = ["DecodeLoop", "KNOWN_TYPES", "supports"]

def prepared(model, gen, input_ids: torch.Tensor, ours: LogitsProcessorList):
    """(generation config, logits processors) as model.generate prepares them for these inputs: transformers'
    processors for the config (the model's generation_config filled in), then ours."""
    gen, model_kwargs = model._prepare_generation_config(gen)  # a deep copy: the caller's config is not changed
    model._prepare_special_tokens(gen, True, device=input_ids.device, batch_size=input_ids.shape[0])
    gen = model._prepare_generated_length(generation_config=gen, has_default_max_length=True,
                                          has_default_min_length=True, model_input_name="input_ids",
                                          input_ids_length=1, inputs_tensor=input_ids)
    processors = model._get_logits_processor(generation_config=gen, input_ids_seq_length=1,
                                             encoder_input_ids=input_ids, logits_processor=ours,
                                             device=input_ids.device, model_kwargs=model_kwargs)
    # transformers re-adds the model's one-token bad words that engines/hf.py's BannedTokens already sets to -inf
    # (a bias tensor over rows x vocabulary, three passes a step): skipped, the scores are the same
    banned = {t for p in ours if type(p).__name__ == "BannedTokens" for t in p.token_ids}
    return gen, CheckedProcessors(p for p in processors if not (
        isinstance(p, NoBadWordsLogitsProcessor) and all(len(w) == 1 and w[0] in banned for w in p.bad_word_ids)))


class ForcedToken:
    """transformers' forced bos / eos processor after the argmax: at its decoding length every row takes its token
    (the argmax of scores that are -inf but for that token's 0; several forced eos ids: the first)."""

    def __init__(self, cur_len: int, token: int):
        self.cur_len, self.token = cur_len, token

    def force(self, tokens: torch.Tensor, cur_len: int) -> None:
        if cur_len == self.cur_len:
            tokens.fill_(self.token)

    def subset(self, rows: list[int]) -> "ForcedToken":
        return self


def greedy_plan(processors, gen):
    """(banned tokens for the output bias, forcings run after the argmax in the processors' order, the processors
    left to run on float32 scores) where each processor is our BannedTokens, transformers' forced bos / eos, one of
    ours with `force` (RowLengthLimit) or our GumbelSampler (it adds finite noise: a forced row's other scores stay
    -inf, so forcing after it is forcing before it); None where another processor is there, or a forced token is
    also banned (the processors then run as generate runs them)."""
    banned, forcings, rest = [], [], []
    for p in processors:
        name = type(p).__name__
        if name == "BannedTokens":
            banned += p.token_ids
        elif isinstance(p, ForcedBOSTokenLogitsProcessor):
            forcings.append(ForcedToken(1, p.bos_token_id))
        elif isinstance(p, ForcedEOSTokenLogitsProcessor):
            forcings.append(ForcedToken(p.max_length - 1, min(token_ids(gen.forced_eos_token_id))))
        elif hasattr(p, "force") and hasattr(p, "subset"):
            forcings.append(p)
        elif name == "GumbelSampler":
            rest.append(p)
        else:
            return None
    forced = {getattr(f, "token", getattr(f, "eos_id", None)) for f in forcings}
    return None if forced & set(banned) else (banned, forcings, CheckedProcessors(rest, checked=True))


class DecodeLoop:
    """Greedy and beam decoding of one Marian / FSMT model (module doc). `steps` counts the decoding steps run and
    `checks` the host reads of done flags, for the host-read tests and benches."""

    def __init__(self, model, check_every: int = 8, free_reads: bool | None = None):
        self.model, self.steps_model, self.check_every = model, Seq2SeqSteps(model), check_every
        self.free_reads = free_reads  # None: True on a CPU (module doc)
        self.steps = self.checks = 0

    def start_token(self, gen) -> int:
        start = gen.decoder_start_token_id
        start = self.model.config.decoder_start_token_id if start is None else start
        return token_ids(start)[0]

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, gen,
                 logits_processor: LogitsProcessorList) -> torch.Tensor:
        gen, processors = prepared(self.model, gen, input_ids, logits_processor)
        if gen.num_beams > 1:
            return beam_search(self, input_ids, attention_mask, gen, processors)
        if gen.num_return_sequences != 1 or gen.do_sample:
            raise ValueError("the decode loop's greedy path returns one sequence a row and does not sample itself "
                             "(engines/hf.py samples with a logits processor)")
        return self._greedy(input_ids, attention_mask, gen, processors)

    def _greedy(self, input_ids, attention_mask, gen, processors) -> torch.Tensor:
        rows, dev, length = input_ids.shape[0], input_ids.device, gen.max_length
        pad = token_ids(gen.pad_token_id)[0]
        eos_ids = token_ids(gen.eos_token_id)
        eos = eos_ids[0] if len(eos_ids) == 1 else torch.tensor(eos_ids, device=dev)  # one id: a comparison
        plan = greedy_plan(processors, gen)
        banned, forcings, rest = plan if plan is not None else ((), [], processors)
        state = self.steps_model.start(input_ids, attention_mask, length, *([banned] if banned else []))
        tokens = torch.full((rows, length), pad, dtype=torch.long, device=dev)
        tokens[:, 0] = self.start_token(gen)
        out = tokens.clone()  # rows land here when dropped, the rest at the end
        origin = torch.arange(rows, device=dev)  # each live row's row in `out`
        unfinished = torch.ones(rows, dtype=torch.bool, device=dev)
        flags = DoneFlags()
        pad_token = torch.tensor(pad, device=dev)  # a 0-d tensor: where() wraps a Python number every step
        free_reads = dev.type == "cpu" if self.free_reads is None else self.free_reads
        current = tokens.select(1, 0)  # the step's input tokens: the column the last step wrote
        for t in range(length - 1):
            scores = self.steps_model.advance(state, current, t)
            if rest:
                scores = rest(tokens.narrow(1, 0, t + 1), scores.float())
            self.steps += 1
            nxt = scores.argmax(-1)
            for forcing in forcings:
                forcing.force(nxt, t + 1)
            current = tokens.select(1, t + 1)
            torch.where(unfinished, nxt, pad_token, out=current)  # a finished row takes pad, as in generate
            unfinished &= nxt.ne(eos) if isinstance(eos, int) else ~torch.isin(nxt, eos)
            if free_reads and not unfinished.numpy().any():  # every row has ended: generate stops here too
                break
            if flags.pending:  # sent a step ago: drop the rows finished by then
                live = [r for r, u in enumerate(flags.receive()) if u]
                self.checks += 1
                if len(live) < tokens.shape[0]:
                    kept = subset_processors(rest, live)
                    if kept is not None or not live:
                        alive = set(live)
                        keep, gone = device_rows([live, [r for r in range(tokens.shape[0]) if r not in alive]], dev)
                        out.index_copy_(0, origin.index_select(0, gone), tokens.index_select(0, gone))
                        if not live:
                            return out
                        tokens, unfinished, origin = (x.index_select(0, keep) for x in (tokens, unfinished, origin))
                        current = tokens.select(1, t + 1)
                        state.select(keep)
                        rest, forcings = kept, [f.subset(live) for f in forcings]
            if (t + 1) % self.check_every == 0 and t + 2 < length:
                flags.send(unfinished)
        out.index_copy_(0, origin, tokens)
        return out
