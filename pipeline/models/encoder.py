"""The one sentence encoder: HF model + pooling, shared by the `embeddings` stage, the evaluator and the trainer.

Poolers (SimCSE's names):
  cls                – [CLS] after the model's pooler (dense + tanh) where it has one
  cls_before_pooler  – [CLS] last hidden state
  mean               – attention-masked mean of the last hidden states (sentence-transformers' default)
  avg_first_last     – masked mean of (first layer + last layer) / 2
  mask               – hidden state at the [MASK] token of a prompt template (PromptBERT / OssCSE)
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import torch
from tqdm.auto import tqdm

from pipeline.engine.memo import row_key
from pipeline.engine.resources import Resource, cuda_device
from pipeline.engine.spec import Memo, package_versions
from pipeline.models.hub import model_fingerprint, pick_device, resolve_model
from pipeline.models.standin import StandInEncoder, is_standin
from pipeline.schema import vectors_table

MIN_ROWS = 8  # see Encoder.encode
# ... and at least this many tokens (rows x length): below ~192 tokens per batch this machine's CPU GEMM takes
# other kernels whose last bits differ (measured on MiniLM: 11 rows of 17 tokens differ from 12+, 32 of 6 from 33+)
MIN_TOKENS = 256
POOLERS = ("cls", "cls_before_pooler", "mean", "mask", "avg_first_last")
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_PROMPT = 'This sentence : "{s}" means [MASK] .'  # PromptBERT's template, OssCSE's T1


def resolve_precision(setting: str, device: str) -> str:
    """float32 | bf16 | fp16 for `Encoder.encode` on `device`. "auto": float32 on CPU (no bf16 speed-up on these
    CPUs, STACK.md), bf16 autocast on a GPU that supports it, else fp16."""
    if setting != "auto":
        return setting
    if str(device).startswith("cuda"):
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "float32"


def pool(outputs, attention_mask: torch.Tensor, pooler: str, mask_positions: torch.Tensor | None = None) -> torch.Tensor:
    """Pool transformer outputs into one vector per sentence."""
    last = outputs.last_hidden_state
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
        return (((hs[1] + hs[-1]) / 2.0) * m).sum(1) / m.sum(1).clamp(min=1e-9)
    raise ValueError(f"unknown pooler {pooler!r}; one of {', '.join(POOLERS)}")


class Encoder(torch.nn.Module):
    """AutoModel + tokenizer + pooler. `encode` for inference, `forward` (with grad) for training."""

    def __init__(self, model, tokenizer, pooler: str = "mean", max_length: int = 128,
                 prompt: str = DEFAULT_PROMPT, precision: str = "float32"):
        super().__init__()
        if pooler not in POOLERS:
            raise ValueError(f"unknown pooler {pooler!r}; one of {', '.join(POOLERS)}")
        self.model, self.tokenizer, self.pooler, self.max_length, self.prompt = model, tokenizer, pooler, max_length, prompt
        self.precision = precision  # of `encode` (resolve_precision); the vectors are always float32
        self.unpad = False  # padding-free forward (pipeline/unpad.py); the trainer turns it on with train.unpad

    @classmethod
    def load(cls, name: str, pooler: str = "mean", max_length: int = 128, device: str = "auto",
             prompt: str = DEFAULT_PROMPT, precision: str = "float32",
             **model_kwargs) -> "Encoder":
        if is_standin(name):
            return StandInEncoder(name)  # same interface (encode, dim, device), no weights: `make scale`
        path = resolve_model(name, "encoder")
        from transformers import AutoModel, AutoTokenizer  # here, not at import: a run whose shards are all reused,
        # and every process that only discovers the stages (a CLI, a Dask worker), never pays for transformers' models

        tok = AutoTokenizer.from_pretrained(path)
        if _takes_pooling_layer(path):  # keep BERT's pooler (dense + tanh): the `cls` pooler reads it
            model_kwargs = {"add_pooling_layer": True, **model_kwargs}
        model = AutoModel.from_pretrained(path, **model_kwargs)
        return cls(model, tok, pooler, max_length, prompt, precision).to(pick_device(device)).eval()

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
        models skip the pad tokens (pipeline/unpad.py): same outputs, ~25% less arithmetic on short sentences. A
        training batch brings its packed layout from collate (`unpad_index`, `unpad_positions`: made on the host, so
        the forward reads nothing back from the device); for one without, the layout is found here."""
        batch = {k: v.to(self.device) for k, v in batch.items()}
        mask_positions = batch.pop("mask_positions", None)
        # unpad.LAYOUT_KEYS, spelt out: importing unpad registers its attention with transformers, only where used
        layout = {k: batch.pop(k) for k in ("unpad_index", "unpad_positions") if k in batch} or None
        hidden = self.pooler == "avg_first_last"
        if self.unpad:
            from pipeline.models.unpad import unpad_layout, unpadded_forward

            if layout is None:  # host reads of the mask; a batch without pads has nothing to skip
                layout = unpad_layout(self.model, batch["attention_mask"])
                if layout is not None and len(layout["unpad_index"]) == batch["attention_mask"].numel():
                    layout = None
        if self.unpad and layout is not None:
            out = unpadded_forward(self.model, batch, output_hidden_states=hidden, output_pooler=self.pooler == "cls",
                                   layout=layout)
        else:
            out = self.model(**batch, output_hidden_states=hidden, return_dict=True)
        return pool(out, batch["attention_mask"], self.pooler, mask_positions)

    def _prompted(self, texts: list[str], template: str | None, max_length: int) -> tuple[list[str], int]:
        """Texts wrapped in the prompt template (sentence truncated, never the template) and the token budget."""
        template = template or self.prompt
        mask_tok = self.tokenizer.mask_token
        if mask_tok is None:
            raise ValueError("pooler 'mask' needs a tokenizer with a mask token")
        pre, post = template.replace("[MASK]", mask_tok).split("{s}")
        n_template = len(self.tokenizer(pre + post, add_special_tokens=True)["input_ids"])
        budget = max(1, max_length - n_template)
        clipped = [self.tokenizer.convert_tokens_to_string(self.tokenizer.tokenize(t)[:budget]) for t in texts]
        return [pre + t + post for t in clipped], max_length + n_template

    @torch.inference_mode()
    def encode(self, texts: list[str], batch_size: int = 128, normalize: bool = True, progress: bool | str = False,
               template: str | None = None) -> np.ndarray:
        """Embed texts as float32 rows (L2-normalised by default), in input order.

        Texts are tokenised once, then batched only with texts of the SAME token length: no padding at all, and
        a row's numbers do not depend on which other rows share its batch (with padding, ~30% of rows change in
        the last bits with the batch composition) — so results are identical whatever the sharding. (Checked
        on CPU; GPU kernels give no such promise.)"""
        was_training = self.training
        self.eval()
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        max_length = self.max_length
        if self.pooler == "mask":
            texts, max_length = self._prompted(texts, template, max_length)
        enc = self.tokenizer(list(texts), truncation=True, max_length=max_length) if texts else {"input_ids": []}
        keys = [k for k in enc.keys() if k in ("input_ids", "attention_mask", "token_type_ids")]
        lengths = np.array([len(ids) for ids in enc["input_ids"]], dtype=np.int64)
        order = np.lexsort((np.arange(len(lengths)), -lengths))  # longest first: memory peaks early
        batches = []
        for length in np.unique(lengths)[::-1]:
            rows = order[lengths[order] == length]
            batches += [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]
        precision = resolve_precision(self.precision, str(self.device))
        desc = progress if isinstance(progress, str) else "encode"
        for idx in tqdm(batches, desc=desc, disable=not progress, unit="batch"):
            real = len(idx)
            # Small batches take other CPU kernels whose last bits differ: repeat rows up to MIN_ROWS rows and
            # MIN_TOKENS tokens, so a row's numbers never depend on how many rows of its length share the shard.
            idx_run = np.resize(idx, max(real, MIN_ROWS, -(-MIN_TOKENS // max(1, int(lengths[idx[0]])))))
            batch = {k: torch.tensor([enc[k][i] for i in idx_run]) for k in keys}
            if self.pooler == "mask":
                batch["mask_positions"] = (batch["input_ids"] == self.tokenizer.mask_token_id).int().argmax(1)
            with torch.autocast(self.device.type, dtype=AUTOCAST.get(precision), enabled=precision in AUTOCAST):
                vec = self.forward(batch).float()
            if normalize:
                vec = torch.nn.functional.normalize(vec, dim=-1)
            out[idx] = vec[:real].cpu().numpy()
        self.train(was_training)
        return out


def _takes_pooling_layer(path: str) -> bool:
    """Whether the AutoModel class for this checkpoint has an `add_pooling_layer` argument (BERT, RoBERTa, MPNet
    ... do; ELECTRA, DistilBERT do not): read from its constructor, not from a list of model types."""
    import inspect

    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    try:
        model_cls = MODEL_MAPPING[type(AutoConfig.from_pretrained(path))]
    except KeyError:
        return False
    return "add_pooling_layer" in inspect.signature(model_cls.__init__).parameters


# ---- the encoder as a declared resource (pipeline/engine/resources.py) of `embeddings`, `pool_embeddings`, `scores`
def encoder_plan(cfg, store=None, n: int = 0, plan: dict | None = None) -> dict:
    """What decides the encoder's numbers besides its settings: its files, the device kind and precision it runs
    at (a Dask worker takes its own GPU of that kind), or the content of the `embeddings.from` file."""
    if cfg.embeddings.source is not None:
        from pipeline.engine.store import file_hash

        from pipeline.identity import unicode_facts

        src = Path(cfg.embeddings.source)  # its rows are matched by text, through `normalise`: Unicode's tables too
        return {"precomputed": file_hash(src) if src.is_file() else f"missing:{src}", "unicode": unicode_facts()}
    device = pick_device(cfg.encoder.device)
    return {"model": model_fingerprint(resolve_model(cfg.encoder.model, "encoder")), "device": device.split(":")[0],
            "precision": resolve_precision(cfg.encoder.precision, device),
            "versions": package_versions("torch", "transformers")}


def load_encoder(cfg, store=None, n: int = 0, plan: dict | None = None) -> "Encoder":
    """`encoder.model` on the plan's device kind and precision (never decided again here), or the vectors of
    `embeddings.from` where that is set."""
    if cfg.embeddings.source is not None:
        from pipeline.models.precomputed import PrecomputedEncoder

        return PrecomputedEncoder(Path(cfg.embeddings.source))
    e, plan = cfg.encoder, plan or encoder_plan(cfg)
    device = cuda_device(plan["device"], f"encoder {e.model}")
    return Encoder.load(e.model, pooler=e.pooler, max_length=e.max_length, device=device, prompt=e.prompt,
                        precision=plan["precision"])


ENCODER = Resource("encoder", encoder_plan, load_encoder, reads=("encoder", "embeddings"))


def check_encoder(cfg) -> None:
    """Before any work: the encoder resolves (downloaded where needed), unless `embeddings.from` replaces it."""
    if cfg.embeddings.source is None:
        resolve_model(cfg.encoder.model, "encoder")


def encode_memo_facts(cfg, plan: dict) -> dict:
    """What shapes a text's vector besides the text: the encoder's settings and its plan (model files, device kind,
    precision, library versions)."""
    return {"settings": cfg.section_hash("encoder", "embeddings"), "encoder": plan.get("encoder")}


ENCODE_MEMO = Memo("encode", encode_memo_facts)  # declared by the stages that embed: embeddings, pool_embeddings, scores
def memo_encode(texts: list[str], memo, load: Callable[[], "Encoder"], batch_size: int,
                progress: str | bool = False) -> np.ndarray:
    """Unit vectors of `texts`, float32 [n, d]: those in the row memo (keyed by the text) read from it, the rest
    encoded by `load()` (the model is loaded only when a text is missing). Equal to encoding them all: `encode` is
    batch-independent (its docstring), so a text's vector does not depend on which others are encoded with it. A
    vector is stored as its 4·d raw bytes (one fixed-size binary column: no list levels to write or decode)."""
    def compute(missing: np.ndarray) -> pa.Table:
        vecs = np.ascontiguousarray(load().encode([texts[i] for i in missing], batch_size=batch_size, normalize=True,
                                                  progress=progress), dtype=np.float32)
        return pa.table({"vec": pa.FixedSizeBinaryArray.from_buffers(pa.binary(4 * vecs.shape[1]), len(missing),
                                                                     [None, pa.py_buffer(vecs)])})

    if not texts:
        return np.zeros((0, 0), np.float32)
    col = memo.rows([row_key(t) for t in texts], compute).column("vec").combine_chunks()
    width = col.type.byte_width
    data = np.frombuffer(col.buffers()[1], np.uint8)[col.offset * width:(col.offset + len(col)) * width]
    return data.view(np.float32).reshape(len(texts), width // 4).copy()


def embed_sentences(sentences: pa.Table, load: Callable[[], "Encoder"], batch_size: int,
                    progress: str | bool = False, memo=None) -> pa.Table:
    """sentences(sid, text) -> embeddings(sid, emb): L2-normalised float32 rows, by the encoder `load()` gives
    (called only when a text needs it); through the row memo when one is given."""
    texts = sentences.column("text").to_pylist()
    if not texts:
        return vectors_table(np.zeros(0, np.int64), np.zeros((0, load().dim), np.float32))
    if memo is None:
        vecs = load().encode(texts, batch_size=batch_size, normalize=True, progress=progress)
    else:
        vecs = memo_encode(texts, memo, load, batch_size, progress)
    return vectors_table(sentences.column("sid").to_numpy(), vecs)
