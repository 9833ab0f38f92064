"""Beam search for the decode loop (decode/loop.py): transformers' vectorised beam search (GenerationMixin.
_beam_search in transformers 5.23), step for step, over our preallocated caches, with settled inputs dropped.

    seqs = beam_search(loop, input_ids, attention_mask, gen, processors)   # what generate(num_beams=...) returns

Each step calls the same helpers generate's loop calls (the model's _get_top_k_continuations,
_get_running_beams_for_next_iteration, _update_finished_beams, _check_early_stop_heuristic), so length_penalty,
early_stopping and num_return_sequences mean what they mean there. Where generate tests "can any input still
improve" on the host every step, this loop reads, every `check_every` steps, which inputs are settled — their
early-stop heuristic says no open beam can beat their finished ones (or, with early_stopping = True, all their
beams are finished) — and drops them. A settled input's finished beams never change again in generate's loop
(its new candidates score -1e9), so dropping it changes nothing of its output.
"""
from __future__ import annotations

import torch

from contramine.pipeline.models.translate.decode.steps import (DoneFlags, device_rows, subset_processors,
                                                               token_ids)


def beam_search(loop, input_ids: torch.Tensor, attention_mask: torch.Tensor, gen, processors) -> torch.Tensor:
    model, steps = loop.model, loop.steps_model
    batch, beams, k, length = input_ids.shape[0], gen.num_beams, gen.num_return_sequences, gen.max_length
    dev, pad = input_ids.device, token_ids(gen.pad_token_id)[0]
    eos = torch.tensor(token_ids(gen.eos_token_id), device=dev)
    early, penalty = gen.early_stopping, gen.length_penalty
    keep_k = max(2, 1 + len(eos)) * beams  # candidates kept a step, as generate keeps them
    top_beams = torch.cat((torch.ones(beams, dtype=torch.bool), torch.zeros(keep_k - beams, dtype=torch.bool))).to(dev)

    state = steps.start(input_ids, attention_mask, length)
    state.expand(beams)
    running = torch.full((batch, beams, length), pad, dtype=torch.long, device=dev)
    running[:, :, 0] = loop.start_token(gen)
    sequences = running.clone()
    running_scores = torch.zeros((batch, beams), device=dev)
    running_scores[:, 1:] = -1e9
    scores = torch.full((batch, beams), -1e9, device=dev)
    finished = torch.zeros((batch, beams), dtype=torch.bool, device=dev)
    improvable = torch.ones((batch, 1), dtype=torch.bool, device=dev)
    running_idx = torch.full((batch, beams, length - 1), -1, dtype=torch.int32, device=dev)
    beam_idx = running_idx.clone()
    out = torch.full((batch, k, length), pad, dtype=torch.long, device=dev)
    origin = torch.arange(batch, device=dev)
    flags = DoneFlags()

    for cur in range(1, length):
        n = running.shape[0]
        flat = running[:, :, :cur].reshape(n * beams, cur)
        log_probs = torch.nn.functional.log_softmax(steps.step(state, flat[:, -1], cur - 1).float(), dim=-1)
        loop.steps += 1
        log_probs = processors(flat, log_probs).view(n, beams, -1) + running_scores[:, :, None]
        top_scores, top_seqs, top_idx = model._get_top_k_continuations(
            accumulated_log_probs=log_probs.reshape(n, -1), running_sequences=running,
            running_beam_indices=running_idx, cur_len=cur, decoder_prompt_len=1, do_sample=False,
            beams_to_keep=keep_k, num_beams=beams, batch_size=n)
        hits = torch.isin(top_seqs[:, :, cur], eos) | (cur + 1 >= length)  # generate's eos and max-length stops
        running, running_scores, running_idx = model._get_running_beams_for_next_iteration(
            topk_log_probs=top_scores, topk_running_sequences=top_seqs, topk_running_beam_indices=top_idx,
            next_token_hits_stopping_criteria=hits, num_beams=beams)
        sequences, scores, beam_idx, finished = model._update_finished_beams(
            sequences=sequences, topk_running_sequences=top_seqs, beam_scores=scores, topk_log_probs=top_scores,
            beam_indices=beam_idx, topk_running_beam_indices=top_idx, is_early_stop_heuristic_unsatisfied=improvable,
            is_sent_finished=finished, next_token_hits_stopping_criteria=hits, top_num_beam_mask=top_beams,
            num_beams=beams, cur_len=cur, decoder_prompt_len=1, length_penalty=penalty, early_stopping=early)
        state.select(running_idx[..., cur - 1].reshape(-1).long())  # the cache follows the kept beams
        improvable = model._check_early_stop_heuristic(
            is_early_stop_heuristic_unsatisfied=improvable, running_beam_scores=running_scores, beam_scores=scores,
            is_sent_finished=finished, cur_len=cur + 1, max_length=length, decoder_prompt_len=1,
            early_stopping=early, length_penalty=penalty)
        if cur + 1 >= length:
            break
        if flags.pending:
            live = [i for i, open_ in enumerate(flags.receive()) if open_]
            loop.checks += 1
            rows = [i * beams + b for i in live for b in range(beams)]
            kept = subset_processors(processors, rows) if len(live) < n else processors
            if kept is not None and len(live) < n:
                alive = set(live)
                keep, gone, beam_rows = device_rows([live, [i for i in range(n) if i not in alive], rows], dev)
                out.index_copy_(0, origin.index_select(0, gone), sequences.index_select(0, gone)[:, :k])
                if not live:
                    return out.reshape(batch * k, length)
                running, running_scores, sequences, scores, finished, improvable, running_idx, beam_idx, origin = (
                    x.index_select(0, keep) for x in (running, running_scores, sequences, scores, finished,
                                                      improvable, running_idx, beam_idx, origin))
                state.select(beam_rows)
                processors = kept
        if cur % loop.check_every == 0:
            settled = ~improvable[:, 0] | (finished.all(-1) if early is True else False)
            flags.send(~settled)
    out.index_copy_(0, origin, sequences[:, :k])
    return out.reshape(batch * k, length)
