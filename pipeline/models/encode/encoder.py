"""The one sentence encoder: HF model + pooling, shared by the `embeddings` stage, the evaluator and the trainer.

Poolers (SimCSE's names):
  cls                – [CLS] after the model's pooler (dense + tanh) where it has one
  cls_before_pooler  – [CLS] last hidden state
  mean               – attention-masked mean of the last hidden states (sentence-transformers' default)
  avg_first_last     – masked mean of (first layer + last layer) / 2
  mask               – hidden state at the [MASK] token of a prompt template (PromptBERT / OssCSE)

The encoder as the embedding stages' resource (its plan, its row memo): encode/resource.py.
"""
from __future__ import annotations

import copy
import inspect
import threading

import numpy as np
import torch
from tqdm.auto import tqdm

from contramine.pipeline.models.attention_kernels import without_cudnn_attention
from contramine.pipeline.models.encode.batches import (Tokens, packed_batches, same_length_batches, token_arrays,
                                            tokenize_threads, tokenized_chunks)
from contramine.pipeline.models.hub import pick_device, resolve_model
from contramine.pipeline.models.standin import StandInEncoder, is_standin

POOLERS = ("cls", "cls_before_pooler", "mean", "mask", "avg_first_last")
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
BATCH_TOKENS = 32768  # a GPU batch: rows x padded length (~1,300 rows of 25 tokens; bert-base: ~7 TFLOP a batch)
FLUSH_ROWS = 32768  # vectors kept on the device before one copy back to the host
_LOCK = threading.Lock()  # encoders' caches, shared HF tokenizers (not an attribute: copy.deepcopy(encoder) works)
DEFAULT_PROMPT = 'This sentence : "{s}" means [MASK] .'  # PromptBERT's template, OssCSE's T1
# models whose forward makes its SDPA mask with transformers' create_bidirectional_mask: given a 2-D mask it asks the
# device whether any token is padding (a host sync per batch), given a 4-D one it uses it as it is
HOST_MASKED_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "electra"})


def resolve_precision(setting: str, device: str) -> str:
    """float32 | bf16 | fp16 for `Encoder.encode` on `device`. "auto": float32 on CPU (no bf16 speed-up on these
    CPUs, STACK.md), bf16 autocast on a GPU that supports it, else fp16."""
    if setting != "auto":
        return setting
    if str(device).startswith("cuda"):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "float32"


def batching(kind: str) -> str:
    """How `encode` batches on a device kind: "same_length" on a CPU (a row's vector does not depend on its batch),
    "packed" elsewhere (lengths merged into token-budget batches: GPU kernels make no such promise)."""
    return "same_length" if kind == "cpu" else "packed"


def held_dtype(precision: str, kind: str) -> torch.dtype | None:
    """The dtype `encode` holds the weights in: bf16 / fp16 on a GPU (cast once), None where it runs the float32
    weights (a CPU's bf16 / fp16 is autocast, as before: its tables keep their bytes)."""
    return AUTOCAST.get(precision) if kind != "cpu" else None


def _wide(t: torch.Tensor) -> torch.Tensor:
    """Half-precision hidden states in float32 for pooling; float32 (and a float64 test's) tensors as they are."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def pool(outputs, attention_mask: torch.Tensor, pooler: str, mask_positions: torch.Tensor | None = None) -> torch.Tensor:
    """Pool transformer outputs into one vector per sentence."""
    last = _wide(outputs.last_hidden_state)
    if pooler == "cls_before_pooler":
        return last[:, 0]
    if pooler == "cls":
        po = getattr(outputs, "pooler_output", None)
        return po if po is not None else last[:, 0]
    if pooler == "mask":
        if mask_positions is None:
            raise ValueError("pooler 'mask' needs mask_positions")
        return last[torch.arange(last.shape[0], device=last.device), mask_positions]
    m = attention_mask.unsqueeze(-1).to(last.dtype)
    if pooler == "mean":
        return (last * m).sum(1) / m.sum(1).clamp(min=1e-9)
    if pooler == "avg_first_last":
        hs = outputs.hidden_states
        return (((_wide(hs[1]) + _wide(hs[-1])) / 2.0) * m).sum(1) / m.sum(1).clamp(min=1e-9)
    raise ValueError(f"unknown pooler {pooler!r}; one of {', '.join(POOLERS)}")


class Encoder(torch.nn.Module):
    """AutoModel + tokenizer + pooler. `encode` for inference, `forward` (with grad) for training."""

    def __init__(self, model, tokenizer, pooler: str = "mean", max_length: int = 128,
                 prompt: str = DEFAULT_PROMPT, precision: str = "float32", batch_tokens: int = BATCH_TOKENS):
        super().__init__()
        if pooler not in POOLERS:
            raise ValueError(f"unknown pooler {pooler!r}; one of {', '.join(POOLERS)}")
        self.model, self.tokenizer, self.pooler, self.max_length, self.prompt = model, tokenizer, pooler, max_length, prompt
        self.precision = precision  # of `encode` (resolve_precision); the vectors are always float32
        self.unpad = False  # padding-free forward (unpad.py); the trainer turns it on with train.unpad
        self.batch_tokens = batch_tokens  # of a GPU's `encode` batch (rows x padded length)
        self._cache: dict = {}  # `encode`'s tokenizer backends and weights held in bf16 / fp16 (_backend, _held)

    @classmethod
    def load(cls, name: str, pooler: str = "mean", max_length: int = 128, device: str = "auto",
             prompt: str = DEFAULT_PROMPT, precision: str = "float32", batch_tokens: int = BATCH_TOKENS,
             **model_kwargs) -> "Encoder":
        if is_standin(name):
            return StandInEncoder(name)  # type: ignore[return-value]  # Encoder's interface, no weights: `make scale`
        path = resolve_model(name, "encoder")
        from transformers import AutoModel, AutoTokenizer  # here, not at import: a run whose shards are all reused,
        # and every process that only discovers the stages (a CLI, a Dask worker), never pays for transformers' models

        tok = AutoTokenizer.from_pretrained(path)
        if _takes_pooling_layer(path):  # keep BERT's pooler (dense + tanh): the `cls` pooler reads it
            model_kwargs = {"add_pooling_layer": True, **model_kwargs}
        model = AutoModel.from_pretrained(path, **model_kwargs)
        return cls(model, tok, pooler, max_length, prompt, precision, batch_tokens).to(pick_device(device)).eval()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def tokenize(self, texts: list[str], template: str | None = None, max_length: int | None = None) -> dict:
        """Dynamic padding to the longest in the batch. With pooler 'mask', wrap each text in the prompt template
        (truncating the sentence, never the template) and record where the [MASK] token sits."""
        max_length = max_length or self.max_length
        if self.pooler != "mask":
            return dict(self.tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt"))
        prompted, max_len = self._prompted(texts, template, max_length)
        batch = dict(self.tokenizer(prompted, padding=True, truncation=True, max_length=max_len, return_tensors="pt"))
        is_mask = batch["input_ids"] == self.tokenizer.mask_token_id
        batch["mask_positions"] = is_mask.int().argmax(1)
        return batch

    def forward(self, batch: dict) -> torch.Tensor:
        """Pooled vectors of a tokenized batch, with grad. With `self.unpad` (the trainer's `train.unpad`), BERT-family
        models skip the pad tokens (unpad.py): same outputs, ~25% less arithmetic on short sentences. A
        training batch brings its packed layout from collate (`unpad_index`, `unpad_positions`: made on the host, so
        the forward reads nothing back from the device); for one without, the layout is found here."""
        return self._pooled(self.model, {k: v.to(self.device) for k, v in batch.items()})

    def _pooled(self, model, batch: dict) -> torch.Tensor:
        """`forward` through `model`: this encoder's own, or its weights held in bf16 / fp16 (`_held`)."""
        batch = dict(batch)
        mask_positions = batch.pop("mask_positions", None)
        model_mask = batch.pop("model_attention_mask", batch.get("attention_mask"))
        # unpad.LAYOUT_KEYS, spelt out: importing unpad registers its attention with transformers, only where used
        layout = {k: batch.pop(k) for k in ("unpad_index", "unpad_positions") if k in batch} or None
        hidden = self.pooler == "avg_first_last"
        if self.unpad:
            # unpad registers an attention kernel with transformers: imported only where a model runs unpadded
            from contramine.pipeline.models.encode.unpad import unpad_layout, unpadded_forward

            if layout is None:  # host reads of the mask; a batch without pads has nothing to skip
                layout = unpad_layout(model, batch["attention_mask"])
                if layout is not None and len(layout["unpad_index"]) == batch["attention_mask"].numel():
                    layout = None
        if self.unpad and layout is not None:
            out = unpadded_forward(model, batch, output_hidden_states=hidden, output_pooler=self.pooler == "cls",
                                   layout=layout)
        else:
            out = model(**{**batch, "attention_mask": model_mask}, output_hidden_states=hidden, return_dict=True)
        return pool(out, batch["attention_mask"], self.pooler, mask_positions)

    def _prompted(self, texts: list[str], template: str | None, max_length: int) -> tuple[list[str], int]:
        """Texts wrapped in the prompt template (sentence truncated, never the template) and the token budget."""
        pre, post, n_template = self._template(template)
        budget = max(1, max_length - n_template)
        clipped = [self.tokenizer.convert_tokens_to_string(self.tokenizer.tokenize(t)[:budget]) for t in texts]
        return [pre + t + post for t in clipped], max_length + n_template

    def _template(self, template: str | None) -> tuple[str, str, int]:
        """The prompt template's text before and after the sentence, and the tokens it adds."""
        template = template or self.prompt
        mask_tok = self.tokenizer.mask_token
        if mask_tok is None:
            raise ValueError("pooler 'mask' needs a tokenizer with a mask token")
        pre, post = template.replace("[MASK]", mask_tok).split("{s}")
        return pre, post, len(self.tokenizer(pre + post, add_special_tokens=True)["input_ids"])

    @torch.inference_mode()
    def encode(self, texts: list[str], batch_size: int = 128, normalize: bool = True, progress: bool | str = False,
               template: str | None = None, batch_tokens: int | None = None) -> np.ndarray:
        """Embed texts as float32 rows (L2-normalised by default), in input order.

        Worker threads tokenise the texts chunk by chunk ahead of the model (encode/batches.py); host arrays are
        numpy, copied to a GPU from pinned memory without a sync, and the vectors come back once per FLUSH_ROWS
        rows, not per batch. How rows are batched depends on the device (`batching`):
        - a CPU: only texts of the SAME token length share a batch (at most `batch_size` rows; below MIN_ROWS rows
          or MIN_TOKENS tokens the rows are repeated): no padding at all, and a row's numbers do not depend on which
          other rows share its batch (with padding, ~30% of rows change in the last bits with the batch
          composition), so results are identical whatever the sharding — the row memo relies on it;
        - a GPU: lengths merged, rows sorted by length into batches of at most `batch_tokens` tokens (rows x
          padded length; default `self.batch_tokens`). GPU kernels give no batch-independence promise anyway: a
          float32 vector moved by 3e-8 with its batch on an H100, and bf16 ones move more.
        `self.precision` "bf16" / "fp16" (resolve_precision) means autocast on a CPU and, on a GPU, a copy of the
        weights held in that dtype (cast once, not per batch); pooling and normalising run in float32 either way."""
        return self._encode(texts, batch_size, normalize, progress, template, batch_tokens, self.device.type)

    def _encode(self, texts, batch_size: int, normalize: bool, progress: bool | str, template: str | None,
                batch_tokens: int | None, kind: str) -> np.ndarray:
        """`encode` under the batching and precision rules of device kind `kind` (tests run a GPU's rules on CPU
        tensors: only pinning and the device copy follow the model's real device)."""
        was_training = self.training
        self.eval()
        out: np.ndarray = np.zeros((len(texts), self.dim), dtype=np.float32)
        precision = resolve_precision(self.precision, str(self.device))
        held = held_dtype(precision, kind)
        model = self._held(held) if held is not None else self.model
        with _LOCK:  # the prompt template's tokens widen the budget (_prompted)
            max_length = self.max_length + (self._template(template)[2] if self.pooler == "mask" else 0)
        chunks = tokenized_chunks(texts, lambda rows, part: self._token_arrays(rows, part, template, max_length),
                                  tokenize_threads())
        if batching(kind) == "same_length":
            batches = same_length_batches(chunks, batch_size)
        else:
            batches = packed_batches(chunks, batch_tokens or self.batch_tokens)
        autocast = torch.autocast(self.device.type, dtype=AUTOCAST.get(precision),
                                  enabled=held is None and precision in AUTOCAST)
        on_device: list[tuple[np.ndarray, torch.Tensor]] = []  # vectors wait on the device: one copy per flush
        waiting = 0
        bar = tqdm(total=len(texts), desc=progress if isinstance(progress, str) else "encode", disable=not progress,
                   unit="text")

        def flush():
            nonlocal waiting
            waiting = 0
            if on_device:
                rows = np.concatenate([r for r, _ in on_device])
                out[rows] = torch.cat([v for _, v in on_device]).cpu().numpy()
                on_device.clear()

        try:
            for batch in batches:
                with autocast, without_cudnn_attention(self.device):  # a batch's shape is new: no plan to build
                    vec = self._pooled(model, self._device_batch(batch)).float()
                if normalize:
                    vec = torch.nn.functional.normalize(vec, dim=-1)
                on_device.append((batch.rows[:batch.real], vec[:batch.real]))
                waiting += batch.real
                if waiting >= FLUSH_ROWS:
                    flush()
                bar.update(batch.real)
            flush()
        finally:
            chunks.close()  # an error mid-way: stop the tokenising threads now, not when the traceback is freed
            bar.close()
            self.train(was_training)
            if was_training:  # a model in training changes its weights: no stale copy kept beside them
                self._cache.pop("held", None)
        return out

    def _token_arrays(self, rows: np.ndarray, texts: list[str], template: str | None, max_length: int) -> Tokens:
        """One chunk tokenised as `self.tokenizer(texts, truncation=True, max_length=max_length)` would (with the
        prompt template where the pooler is "mask"), into numpy arrays. Runs in the tokenising threads, on a private
        copy of the fast tokenizer's backend that nothing reconfigures (HF's __call__ sets truncation and padding on
        the shared one each call: a concurrent encode_batch would fail with "Already borrowed")."""
        if self.pooler == "mask":
            with _LOCK:  # _prompted calls the shared HF tokenizer
                texts, _ = self._prompted(texts, template, self.max_length)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        types = "token_type_ids" in self.tokenizer.model_input_names
        backend = self._backend(max_length)
        if backend is None:  # a slow (Python) tokenizer
            with _LOCK:
                enc = self.tokenizer(texts, truncation=True, max_length=max_length)
            return token_arrays(rows, enc["input_ids"], enc["token_type_ids"] if types else None, pad_id)
        encode_batch = getattr(backend, "encode_batch_fast", backend.encode_batch)  # no offsets: tokenizers >= 0.20
        encodings = encode_batch(texts)
        return token_arrays(rows, [e.ids for e in encodings], [e.type_ids for e in encodings] if types else None,
                            pad_id)

    def _backend(self, max_length: int):
        """This encoder's own copy of the fast tokenizer's backend, truncating at `max_length`, never padding."""
        if not getattr(self.tokenizer, "is_fast", False):
            return None
        key = ("backend", max_length)
        with _LOCK:
            if key not in self._cache:
                tok = self.tokenizer
                backend = copy.deepcopy(tok.backend_tokenizer)
                backend.no_padding()
                backend.enable_truncation(max_length, stride=0, strategy="longest_first", direction=tok.truncation_side)
                backend.encode_special_tokens = bool(getattr(tok, "split_special_tokens", False))
                self._cache[key] = backend
            return self._cache[key]

    def _device_batch(self, batch: Tokens) -> dict:
        """A batch as the model's tensors on its device: from numpy without a copy, through pinned memory and a
        copy that does not wait (non_blocking) to a GPU. Where the model is one of HOST_MASKED_TYPES under SDPA,
        the mask it is given is decided here from the host's lengths (`model_attention_mask`): none for a batch
        without padding (what transformers' check would find), else the 4-D boolean mask its SDPA mask is
        (rows, 1, 1, length; True = a real token), so the forward asks the device nothing and the next batch is
        queued while this one runs."""
        mask = batch.attention_mask()
        arrays = {"input_ids": batch.ids, "attention_mask": mask}
        if batch.types is not None:
            arrays["token_type_ids"] = batch.types
        config = self.model.config
        host_masked = config.model_type in HOST_MASKED_TYPES and config._attn_implementation == "sdpa"
        padded = bool(len(batch.lengths)) and int(batch.lengths.min()) < batch.ids.shape[1]
        if host_masked and padded:
            arrays["model_attention_mask"] = mask.astype(bool)[:, None, None, :]
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
        if host_masked and not padded:
            tensors["model_attention_mask"] = None
        if self.device.type == "cuda":
            tensors = {k: v if v is None else v.pin_memory().to(self.device, non_blocking=True)
                       for k, v in tensors.items()}
        if self.pooler == "mask":
            tensors["mask_positions"] = (tensors["input_ids"] == self.tokenizer.mask_token_id).int().argmax(1)
        return tensors

    def _held(self, dtype: torch.dtype) -> torch.nn.Module:
        """The model with its floating weights cast to `dtype` once, for a GPU's bf16 / fp16 `encode` (autocast
        re-casts every weight on every batch: 221 casts per bert-base forward). Kept while the weights are the same
        tensors at the same version; the float32 model is left as it is (a training run keeps training it)."""
        tensors = [*self.model.parameters(), *self.model.buffers()]
        stamp = (dtype, tuple((id(t), t.data_ptr(), t._version) for t in tensors))
        with _LOCK:
            held = self._cache.get("held")
            if held is None or held[0] != stamp:
                self._cache.pop("held", None)  # the old copy goes before the new one is made
                memo = {id(t): torch.nn.Parameter(t.detach().to(dtype), requires_grad=False)
                        if isinstance(t, torch.nn.Parameter) and t.is_floating_point() else
                        t.detach().to(dtype) if t.is_floating_point() else t for t in tensors}
                held = self._cache["held"] = (stamp, copy.deepcopy(self.model, memo))
            return held[1]


def _takes_pooling_layer(path: str) -> bool:
    """Whether the AutoModel class for this checkpoint has an `add_pooling_layer` argument (BERT, RoBERTa, MPNet
    ... do; ELECTRA, DistilBERT do not): read from its constructor, not from a list of model types."""
    from transformers import AutoConfig  # transformers: as in Encoder.load, only when a model loads
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    try:
        model_cls = MODEL_MAPPING[type(AutoConfig.from_pretrained(path))]
    except KeyError:
        return False
    return "add_pooling_layer" in inspect.signature(model_cls.__init__).parameters
