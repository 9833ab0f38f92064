"""One decoding step of a Marian or FSMT model over caches preallocated for the batch (decode/loop.py drives it).

    steps = Seq2SeqSteps(model)                       # model: MarianMTModel or FSMTForConditionalGeneration
    state = steps.start(input_ids, attention_mask, n_tokens, banned)   # encoder once; cross-attention K/V once
    logits = steps.step(state, tokens, t)             # (rows, vocab) in the model's dtype for decoder position t
    state.select(index)                               # keep / reorder rows (dropped rows, beams)

The encoder runs once per batch and the cross-attention keys and values of every decoder layer are computed once
from its output. The self-attention keys and values go into buffers allocated once per batch for `n_tokens`
positions (the batch's longest cap plus its start token), written in place at each step and read as a view of the
positions so far: no cache is copied per step and no mask is built (every position up to t is a real token). A
layer's K and V share one buffer, written by one addmm of the two projections side by side (on this CPU the same
bits as two, over 150 shapes; a GPU's GEMM may pick another kernel for the wider product and differ in the last
bit); the token embeddings are scaled once per weights, not once a step (the same multiply, element for element).
The arithmetic is the model's own, module for module (its projections, layer norms, activation and output layer:
the same kernels on the same tensors: a projection is the addmm / mm that F.linear calls, a norm torch.layer_norm,
with the layers' tensors read once a batch, LayerWeights, so a step's host work is its ops and not ~12 module
calls a layer), with the attention HF uses for that model: SDPA for Marian (its default), FSMT's eager form (q
scaled first, padding filled with the dtype's minimum). Both are post-norm transformers, the layer order below.

Memory traffic per step (a GPU's thousands of rows: the logits are the step's largest tensor): the output bias goes
into the output projection's addmm (one pass over rows x vocabulary, not a product and then a sum), with the
batch's banned tokens as -inf in its own copy of that bias (`start(..., banned)`: no processor pass), and the
logits stay in the model's dtype (the greedy loop's argmax needs no float32 copy: the cast is exact). SDPA's
cross-attention bias is allocated with its last dim padded to a multiple of 8 and narrowed: the memory-efficient
kernel otherwise pads an unaligned bias itself, in every layer of every step.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from transformers import (ForcedBOSTokenLogitsProcessor, ForcedEOSTokenLogitsProcessor, LogitsProcessorList,
                          MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor, NoBadWordsLogitsProcessor)

KNOWN_TYPES = ("marian", "fsmt")


def supports(model) -> bool:
    """Whether this loop knows the model's architecture (config.model_type)."""
    return getattr(model.config, "model_type", None) in KNOWN_TYPES


@dataclass
class StepState:
    """A batch's tensors on the device, one row per decoder row: the encoder's padding (True = a real token), each
    layer's cross-attention K/V and self-attention K/V buffers, (rows, heads, positions, head_dim)."""
    enc_keep: torch.Tensor
    cross_k: list[torch.Tensor]
    cross_v: list[torch.Tensor]
    self_k: list[torch.Tensor]
    self_v: list[torch.Tensor]
    rows: dict[str, torch.Tensor] = field(default_factory=dict)  # any other per-row tensor that must follow the rows
    layers: list | None = None  # the decoder layers' tensors (Seq2SeqSteps.layers), read once a batch
    inputs: tuple | None = None  # the scaled token embeddings and position rows (Seq2SeqSteps.inputs), likewise
    ends: tuple | None = None  # (token embeddings, output projection, its bias or None), read once a batch
    enc_bias: torch.Tensor | None = None  # SDPA's additive form of enc_keep (0 / -inf), made once a batch
    cross_mask: torch.Tensor | None = None  # what the cross-attention gets: enc_bias's real columns, else enc_keep
    # the self-attention K/V's memory, (rows, positions, 2 x d_model) per layer, K's columns then V's (self_k /
    # self_v are head views of it): one addmm of the fused projection writes both into a step's position (`out=`)
    self_kv_rows: list[torch.Tensor] = field(default_factory=list)

    def __post_init__(self):
        self._narrow()
        self._head_views()

    def _head_views(self) -> None:
        """self_k / self_v as (rows, heads, positions, head_dim) views of self_kv_rows' two halves, where those hold
        the memory."""
        if self.self_kv_rows:
            heads, hd = self.self_k[0].shape[1], self.self_k[0].shape[3]
            width = heads * hd
            self.self_k[:], self.self_v[:] = ([x.narrow(2, start, width).view(*x.shape[:2], heads, hd).transpose(1, 2)
                                               for x in self.self_kv_rows] for start in (0, width))

    def _narrow(self) -> None:
        """cross_mask: enc_bias (its last dim padded to a multiple of 8) narrowed to the encoder's positions, a view
        of the aligned tensor (SDPA would convert enc_keep into such a bias every call)."""
        width = self.enc_keep.shape[-1]
        self.cross_mask = self.enc_keep if self.enc_bias is None else self.enc_bias.narrow(-1, 0, width)

    def select(self, index: torch.Tensor) -> None:
        """Keep rows `index` (a device tensor of row numbers, in their new order)."""
        self.enc_keep = self.enc_keep.index_select(0, index)
        if self.enc_bias is not None:
            self.enc_bias = self.enc_bias.index_select(0, index)  # the padded tensor: its rows stay aligned
        self._narrow()
        self.rows = {k: v.index_select(0, index) for k, v in self.rows.items()}
        for group in (self.cross_k, self.cross_v, self.self_kv_rows):
            group[:] = [x.index_select(0, index) for x in group]
        self._head_views()

    def expand(self, times: int) -> None:
        """Each row repeated `times` times in place (beam search's beams of one input, HF's expansion order)."""
        self.select(torch.arange(self.enc_keep.shape[0], device=self.enc_keep.device).repeat_interleave(times))


class Seq2SeqSteps:
    """The encoder once per batch and the decoder one position at a time, for a Marian or FSMT model."""

    def __init__(self, model):
        if not supports(model):
            raise ValueError(f"the decode loop knows {', '.join(KNOWN_TYPES)} models, not "
                             f"{getattr(model.config, 'model_type', None)!r}")
        self.model = model
        self.fsmt = model.config.model_type == "fsmt"
        self.encoder, self.decoder = model.model.encoder, model.model.decoder
        self.pad = model.config.pad_token_id
        self.eager = self.fsmt or model.config._attn_implementation != "sdpa"
        layer = self.decoder.layers[0].self_attn
        self.heads, self.head_dim = layer.num_heads, layer.head_dim
        self._cached: tuple = (None, None, None)  # (weights key, layers, input tables): one tuple, set at once

    def layers(self) -> list[LayerWeights]:
        """Each decoder layer's tensors (with inputs(): remade when the weights are replaced, moved or changed in
        place), which the step calls through torch.nn.functional, not through ~12 module calls a layer."""
        return self._weights()[1]

    def inputs(self) -> tuple:
        return self._weights()[2]  # _input_tables() for the current weights

    def _weights(self) -> tuple:
        first = self.decoder.layers[0].self_attn.q_proj.weight
        copied = [first, self.decoder.embed_tokens.weight, *(t for layer in self.decoder.layers for p in (
            layer.self_attn.k_proj, layer.self_attn.v_proj) for t in (p.weight, p.bias) if t is not None)]
        key = (first.dtype, first.device, *((t.data_ptr(), t._version) for t in copied))
        cached = self._cached  # read once: threads decoding with one model share it, and it is replaced whole
        if cached[0] != key:
            with torch.no_grad():  # copies that no gradient flows through, whatever mode the caller is in
                cached = (key, [LayerWeights.of(layer) for layer in self.decoder.layers], self._input_tables())
            self._cached = cached
        return cached

    def _input_tables(self) -> tuple:
        """(token embeddings times embed_scale: the step's multiply, element for element, made once per weights;
        Marian's position rows as a tuple of views, indexed in Python, not by a `select` a step; FSMT: None)."""
        d = self.decoder
        embed = d.embed_tokens.weight
        if d.embed_scale != 1.0:  # x * 1.0 is x, bit for bit: no copy where the scale is 1
            embed = embed * d.embed_scale
        return embed, None if self.fsmt else d.embed_positions.weight.unbind(0)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, positions, d_model) -> (rows, heads, positions, head_dim)"""
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    @torch.inference_mode()
    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_tokens: int,
              banned: tuple[int, ...] | list[int] = ()) -> StepState:
        """The batch's state; `banned`: tokens whose logits are -inf at every step (in the output bias)."""
        positions = self.decoder.embed_positions
        if self.fsmt and self.pad + 1 + n_tokens > positions.weight.shape[0]:  # as FSMT's own forward grows it
            positions.make_weight(self.pad + 1 + n_tokens, positions.embedding_dim, positions.padding_idx)
        enc = self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0]
        rows, dtype, dev = enc.shape[0], enc.dtype, enc.device
        cross_k, cross_v, kv_rows = [], [], []
        for layer in self.decoder.layers:
            a = layer.encoder_attn
            cross_k.append(self._heads(a.k_proj(enc)))
            cross_v.append(self._heads(a.v_proj(enc)))
            kv_rows.append(torch.empty((rows, n_tokens, 2 * self.heads * self.head_dim), dtype=dtype, device=dev))
        keep = attention_mask.bool()[:, None, None, :]
        bias = None if self.eager else aligned_bias(keep, dtype)
        empty = torch.empty((0, self.heads, 0, self.head_dim), dtype=dtype, device=dev)  # (shapes; views next)
        _, layers, inputs = self._weights()  # one version of both, whatever another thread does to the cache
        return StepState(keep, cross_k, cross_v, [empty] * len(kv_rows), [empty] * len(kv_rows), layers=layers,
                         inputs=inputs, enc_bias=bias, ends=self.ends(banned), self_kv_rows=kv_rows)

    def ends(self, banned=()) -> tuple:
        """(token embedding table, output projection transposed, its bias): the step calls F.embedding and
        `linear` on them as nn.Embedding and nn.Linear do. The bias (Marian's final_logits_bias, which its forward
        adds after the product; FSMT has none) is the product's addmm bias, a vector; with `banned` tokens a copy
        of it (zeros where the model has none) holds -inf in their columns."""
        d = self.decoder
        if self.fsmt:
            embed, project, bias = d.embed_tokens.weight, d.output_projection.weight.t(), None
        else:
            embed, project, bias = d.embed_tokens.weight, self.model.lm_head.weight.t(), self.model.final_logits_bias
            bias = bias.reshape(-1)  # (1, vocab) -> (vocab,): addmm's bias as cuBLAS' epilogue takes it
        if banned:
            bias = torch.zeros(project.shape[1], dtype=project.dtype, device=project.device) if bias is None \
                else bias.clone()
            bias[list(banned)] = float("-inf")
        return embed, project, bias

    def _attend(self, q, k, v, keep) -> torch.Tensor:
        if self.eager:  # FSMT's arithmetic (modeling_fsmt.Attention): q scaled before the product
            scores = torch.matmul(q, k.transpose(-1, -2))
            if keep is not None:
                scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
            return torch.matmul(F.softmax(scores, dim=-1), v)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)

    @torch.inference_mode()
    def step(self, state: StepState, tokens: torch.Tensor, t: int) -> torch.Tensor:
        """`advance` under torch.inference_mode (decode/loop.py, already in it, calls `advance`: no guard a step)."""
        return self.advance(state, tokens, t)

    def advance(self, state: StepState, tokens: torch.Tensor, t: int) -> torch.Tensor:
        """Logits (rows, vocab), in the model's dtype, for the next token after `tokens` (rows,) at decoder
        position t (the banned tokens of `start` at -inf).

        Each layer's arithmetic is its modules' (the same addmm / layer_norm / activation kernels on the same
        tensors, in the same order), called directly: the host's work a step is the ops themselves, which a GPU
        waits for. The hidden state is kept (rows, d_model) (one query position: the same products, row for row, as
        the modules' (rows, 1, d_model)), so a head view is a view and the caches are written through select /
        narrow, not through indexing's slice objects."""
        d = self.decoder
        _, project, project_bias = state.ends or self.ends()
        layers = state.layers or self.layers()
        scaled_embed, positions = state.inputs or self.inputs()
        x = F.embedding(tokens, scaled_embed)  # = embedding(tokens) * embed_scale, element for element
        if self.fsmt:  # fairseq positions: pad + 1 + t for a real token, pad + t for a pad (make_positions)
            x = x + F.embedding(tokens.ne(self.pad).long() + (self.pad + t), d.embed_positions.weight)
        else:
            x = x + positions[t]
        rows, width, heads, hd = x.shape[0], x.shape[-1], self.heads, self.head_dim
        for i, w in enumerate(layers):
            k_cache, v_cache = state.self_k[i], state.self_v[i]
            # K's and V's projections in one addmm, landing in the caches' position t
            linear(x, w.kv, w.kv_bias, out=state.self_kv_rows[i].select(1, t))
            q = linear(x, w.q, w.q_bias).view(rows, heads, 1, hd)
            h = self._attend(q * w.scaling if self.eager else q, k_cache.narrow(2, 0, t + 1),
                             v_cache.narrow(2, 0, t + 1), None)
            x = torch.layer_norm(x + linear(h.reshape(rows, width), w.out, w.out_bias),
                                 (width,), w.norm1, w.norm1_bias, w.norm1_eps)
            q = linear(x, w.cross_q, w.cross_q_bias).view(rows, heads, 1, hd)
            h = self._attend(q * w.scaling if self.eager else q, state.cross_k[i], state.cross_v[i], state.cross_mask)
            x = torch.layer_norm(x + linear(h.reshape(rows, width), w.cross_out, w.cross_out_bias),
                                 (width,), w.norm2, w.norm2_bias, w.norm2_eps)
            x = torch.layer_norm(x + linear(w.activation(linear(x, w.fc1, w.fc1_bias)), w.fc2, w.fc2_bias),
                                 (width,), w.norm3, w.norm3_bias, w.norm3_eps)
        return linear(x, project, project_bias)


def aligned_bias(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """SDPA's additive mask of `keep` (rows, 1, 1, S) (0 where True, -inf where False), allocated (rows, 1, 1, S
    rounded up to a multiple of 8), the padding 0 (StepState.cross_mask reads the first S columns)."""
    width = keep.shape[-1]
    full = torch.zeros((*keep.shape[:-1], -(-width // 8) * 8), dtype=dtype, device=keep.device)
    full.narrow(-1, 0, width).masked_fill_(~keep, float("-inf"))
    return full


def linear(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight_t.t(), bias) for a 2-D x, called as at::linear calls it (addmm with the bias, mm
    without): the same kernel on the same tensors, without linear's dispatch and weight.t() every call. `out`: a
    2-D view whose rows may be strided (a cache's position): the GEMM writes it in place."""
    if out is None:
        return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)
    return torch.mm(x, weight_t, out=out) if bias is None else torch.addmm(bias, x, weight_t, out=out)


class LayerWeights(NamedTuple):
    """One decoder layer's parameters as tensors (Marian's and FSMT's layers name them alike); projection
    weights transposed (views, in x out), as `linear` takes them."""
    q: torch.Tensor
    q_bias: torch.Tensor | None
    kv: torch.Tensor  # k's and v's columns side by side: one addmm computes both (the same products, bit for bit)
    kv_bias: torch.Tensor | None
    out: torch.Tensor
    out_bias: torch.Tensor | None
    scaling: float
    norm1: torch.Tensor
    norm1_bias: torch.Tensor
    norm1_eps: float
    cross_q: torch.Tensor
    cross_q_bias: torch.Tensor | None
    cross_out: torch.Tensor
    cross_out_bias: torch.Tensor | None
    norm2: torch.Tensor
    norm2_bias: torch.Tensor
    norm2_eps: float
    fc1: torch.Tensor
    fc1_bias: torch.Tensor | None
    fc2: torch.Tensor
    fc2_bias: torch.Tensor | None
    norm3: torch.Tensor
    norm3_bias: torch.Tensor
    norm3_eps: float
    activation: object

    @classmethod
    def of(cls, layer) -> "LayerWeights":
        a, c = layer.self_attn, layer.encoder_attn
        n1, n2, n3 = layer.self_attn_layer_norm, layer.encoder_attn_layer_norm, layer.final_layer_norm
        biases = (a.k_proj.bias, a.v_proj.bias)
        kv_bias = None if biases == (None, None) else torch.cat([  # a missing one adds 0 (never in Marian or FSMT)
            torch.zeros_like(a.k_proj.weight[:, 0]) if b is None else b for b in biases])
        return cls(a.q_proj.weight.t(), a.q_proj.bias, torch.cat([a.k_proj.weight, a.v_proj.weight]).t(), kv_bias,
                   a.out_proj.weight.t(), a.out_proj.bias, a.scaling, n1.weight, n1.bias, n1.eps,
                   c.q_proj.weight.t(), c.q_proj.bias, c.out_proj.weight.t(), c.out_proj.bias, n2.weight, n2.bias,
                   n2.eps, layer.fc1.weight.t(), layer.fc1.bias, layer.fc2.weight.t(), layer.fc2.bias, n3.weight,
                   n3.bias, n3.eps,
                   getattr(layer.activation_fn, "forward", layer.activation_fn))  # a module's forward: no hooks


# transformers' processors whose work on a row depends on that row alone (no per-row state of their own): kept as
# they are when rows are dropped. Ours (engines/hf.py) carry per-row lists and have a `subset(rows)`.
ROW_WISE = (NoBadWordsLogitsProcessor, ForcedBOSTokenLogitsProcessor, ForcedEOSTokenLogitsProcessor,
            MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor)


def subset_processors(processors: LogitsProcessorList, rows: list[int]) -> LogitsProcessorList | None:
    """The processors for the kept `rows` (in order), or None where one of them cannot say (then no row is
    dropped: outputs stay right, only slower)."""
    out = []
    for p in processors:
        if hasattr(p, "subset"):
            out.append(p.subset(rows))
        elif isinstance(p, ROW_WISE) or type(p).__name__ == "BannedTokens":
            out.append(p)
        else:
            return None
    return CheckedProcessors(out, checked=isinstance(processors, CheckedProcessors))


class CheckedProcessors(LogitsProcessorList):
    """transformers' LogitsProcessorList without its `inspect.signature` of every processor on every step (~0.1 ms
    of a step's host time here): each processor's arguments are checked once, when the list is made. The loop
    passes (input_ids, scores) only, so a processor that needs more fails here as it would in generate."""

    def __init__(self, processors=(), checked: bool = False):
        super().__init__(processors)
        for p in [] if checked else self:  # checked: a subset of a list checked already
            extra = extra_parameters(p)
            if extra:
                raise ValueError(f"{type(p).__name__} needs {extra}: the decode loop passes input_ids and scores only")

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for p in self:
            scores = p(input_ids, scores)
        return scores


def extra_parameters(processor) -> list[str]:
    """The parameters `processor` takes past (input_ids, scores). inspect.signature costs ~4 ms a processor (it
    reads the annotations of the module): a class's __call__ is inspected once, a plain callable every time."""
    call = processor.__call__
    if inspect.ismethod(call) and inspect.isfunction(call.__func__):
        return list(_method_parameters(call.__func__)[3:])  # (self, input_ids, scores, ...)
    return list(inspect.signature(call).parameters)[2:]


@functools.lru_cache(maxsize=None)
def _method_parameters(call) -> tuple[str, ...]:
    return tuple(inspect.signature(call).parameters)


class DoneFlags:
    """A row-wise bool tensor brought to the host without waiting: `send` starts the copy (into pinned memory on a
    GPU), `receive` waits for it (by then the device has later work queued) and returns the values as a list."""

    def __init__(self):
        self.host, self.event = None, None

    def send(self, flags: torch.Tensor) -> None:
        if flags.device.type == "cuda":
            self.host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
            self.host.copy_(flags, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = flags.clone()  # the values at this step (the loop updates flags in place)

    @property
    def pending(self) -> bool:
        return self.host is not None

    def receive(self) -> list[bool]:
        if self.event is not None:
            self.event.synchronize()
        values, self.host, self.event = self.host.tolist(), None, None
        return values


def token_ids(value) -> list[int]:
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [int(value)]


def device_rows(groups: list[list[int]], device: torch.device) -> list[torch.Tensor]:
    """Lists of row numbers as index tensors on `device`, through one host tensor: on a GPU pinned and copied
    without waiting (torch.tensor(rows, device=...) copies from pageable memory, which waits for the device)."""
    host = torch.tensor([r for g in groups for r in g], dtype=torch.long, pin_memory=device.type == "cuda")
    return list(host.to(device, non_blocking=True).split([len(g) for g in groups]))
