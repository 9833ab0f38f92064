"""OssCSE (Liu et al., "Identifying and Mitigating Surface Structure Bias in Contrastive Sentence Embeddings"
— "surface structure bias", EMNLP 2023, §4).

Inputs: rows of `sentences` joined with `triplets`: `text` (the anchor s), `paraphrase` (sᵖ, may be None) and
`negation` (sⁿ, may be None). In the paper's form (`form = "paper"`, the default) the encoder's pooler must be
"mask": a sentence's representation is the last hidden state at the [MASK] token of a prompt template
(`Encoder.tokenize(texts, template=...)`).

    L = l_c + l_r + λ·l_m          (λ = margin_weight)

l_c — InfoNCE whose two views are the two templates T1, T2 = templates
      (`This sentence : "{s}" means [MASK] .`, `This sentence of "{s}" means [MASK] .`), with dropout:
      ℓ_i = −log e^{cos(h_i, h'_i)/τ} / Σ_j e^{cos(h_i, h'_j)/τ},  h = f(T1(s)), h' = f(T2(s)),  l_c = (1/B) Σ_i ℓ_i.
l_m — two-way max margin, for the rows that have BOTH a paraphrase and a negation (the other rows skip the term;
      the mean is over the rows that have it, 0 when none), all three under T1, sim = cos:
      m_i = max(sim(h,hⁿ) − sim(h,hᵖ) + α, 0) + max(sim(h,hᵖ) − sim(h,hⁿ) − β, 0)
      (α = alpha: the paraphrase must beat the negation by α; β = beta: but not by more
      than β, so the model does not learn to separate them by surface form alone).
l_r — recall of the starting weights: γ/2 · Σ (θ − θ*)² over every encoder parameter (γ = recall_weight).
      θ* is a detached copy of the encoder's weights taken when the objective is constructed — construct it
      AFTER loading the start weights and BEFORE any step. It is a plain attribute, not a buffer: it is not in
      state_dict, not broadcast by DDP, and it moves to the parameters' device on first use.

Our deviation, `form = "start-pooler"` ([train.osscse]): for a start that was not trained for [MASK] pooling (a
mean-pooled sentence-transformer: MiniLM scores 78.87 under mean pooling, 39.08 under the [MASK] of T1), no template
and the start's own pooler (train.pooler, else encoder.pooler); l_c's two views are two dropout passes of the same
sentence (SimCSE's views, one forward over the batch stacked twice), l_m reads h from the first of them and hᵖ, hⁿ
with the same pooler; l_r unchanged. Only where the sentence vector is read from changes: the three terms, their
weights and the data are the paper's.

Distributed: l_c uses gathered candidates with the (W/B)·Σ_local scaling, l_m the same scaling over the global
count of rows that have it, l_r is replicated on every rank and added unscaled (trainer/dist.py).

One forward per step: the anchors under T1 and under T2 (form "start-pooler": the anchors twice, two dropout views),
the paraphrases and the negations are stacked by collate into one batch (common.joined: padded to the longest row of
all, laid out padding-free on the host) and split back after pooling. A row's vector is the one a forward of its own
group gives: attention sees its own tokens and, with dropout on, each row draws its own mask, as in four separate
passes (tests/test_one_forward.py: loss and gradients equal the four-pass form to 1e-6 in float64).

collate(rows) -> {"enc.*": anchors (T1), anchors (T2), paraphrases, negations stacked, "groups": (B, B, n, n)
                  (n = the rows with both a paraphrase and a negation, may be 0),
                  "trip_index": LongTensor[n] (the rows those triplets belong to)}
forward(batch) -> (loss, {"l_c", "l_m", "l_r"}: detached 0-dim tensors)
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, field_validator

from contramine.pipeline.config import Section
from contramine.pipeline.prompts import OSSCSE_TEMPLATES
from contramine.trainer import dist
from contramine.trainer.objectives.base import Objective, settings_of
from contramine.trainer.objectives.common import cos_rows, info_nce_terms, joined


class OssCSE(Objective):
    name = "osscse"
    tables = ("sentences", "triplets")
    loss, export_format = "OssCSELoss", "osscse-prompt"
    pooler = "mask"

    class Settings(Section):
        """OssCSE §5: α = 0.05, β = 0.2, λ = 1e-3, γ = 2e-3, the two PromptBERT templates."""
        alpha: float = Field(0.05, description="α: the paraphrase must beat the negation by this much")
        beta: float = Field(0.2, description="β: ... but not by more than this")
        margin_weight: float = Field(1e-3, ge=0, description="λ, the weight of l_m")
        recall_weight: float = Field(2e-3, ge=0, description="γ of l_r = γ/2 Σ (θ − θ*)²")
        templates: list[str] = list(OSSCSE_TEMPLATES)  # T1, T2: the two PromptBERT templates of the paper
        form: Literal["paper", "start-pooler"] = Field(
            "paper", description="paper: the [MASK] vector of the two templates; start-pooler (ours): no template, "
                                 "the start's own pooler, l_c over two dropout views")

        @field_validator("templates")
        @classmethod
        def _templates(cls, v):
            if len(v) != 2:
                raise ValueError(f"osscse needs exactly two templates, got {len(v)}")
            for t in v:
                if "{s}" not in t or "[MASK]" not in t:
                    raise ValueError(f"template {t!r} must contain '{{s}}' and '[MASK]'")
            return v

    @classmethod
    def train_pooler(cls, cfg) -> str | None:
        """"mask" in the paper's form; the configured pooler (None) in form "start-pooler"."""
        from contramine.trainer.objectives.base import settings_of

        return "mask" if settings_of(cls, cfg).form == "paper" else None

    @classmethod
    def eval_prompt(cls, cfg) -> str | None:
        """T1: what the model was trained to read its [MASK] vector from is what evaluation must use (the paper's
        form; form "start-pooler" reads no template: None)."""
        from contramine.trainer.objectives.base import settings_of

        st = settings_of(cls, cfg)
        return st.templates[0] if st.form == "paper" else None

    @classmethod
    def data_notes(cls, rows) -> list[str]:
        both = rows.count_present("paraphrase", "negation")
        if both:
            return []
        para, neg = rows.count_present("paraphrase"), rows.count_present("negation")
        return [f"OssCSE's max-margin term l_m is 0 for this WHOLE run: none of the {len(rows)} training rows has "
                f"both a paraphrase and a negation ({para} have a paraphrase, {neg} a negation), so only l_c and "
                f"l_r train. Mine paraphrases with back-translation chains (role \"paraphrases\", e.g. make mine "
                f"PROFILE=osscse-paper where the hub is reachable) to train the full objective."]

    @classmethod
    def start_notes(cls, train_cfg, start_dir: Path | str) -> list[str]:
        """The paper's form reads the [MASK] of a template. A sentence-transformers start (1_Pooling/config.json) was
        trained for another pooler and scores far lower there: say so, with the setting that keeps its pooler."""
        pooling, ours = Path(start_dir) / "1_Pooling" / "config.json", Path(start_dir) / "train_config.json"
        if settings_of(cls, train_cfg).form != "paper" or not pooling.is_file():
            return []
        if ours.is_file():  # a checkpoint of this project: it says which pooler it was trained with
            said, modes = ours, [json.loads(ours.read_text()).get("pooler")]
        else:
            said, modes = pooling, [k.removeprefix("pooling_mode_").removesuffix("_token").removesuffix("_tokens")
                                    for k, v in json.loads(pooling.read_text()).items()
                                    if k.startswith("pooling_mode_") and v is True]
        if modes == ["mask"]:
            return []
        return [f"OssCSE's paper form reads the [MASK] of its first template, but this start ({start_dir}) was trained "
                f"for {' + '.join(modes) or 'another'} pooling ({said.relative_to(start_dir)}): there it scores far "
                f"lower (MiniLM: 39.08 STS avg at the [MASK] against 78.87 mean-pooled), and 100 steps did not win "
                f"that back (docs/compare/table.md). [train.osscse] form = \"start-pooler\" trains OssCSE under the "
                f"start's own pooler."]

    def __init__(self, encoder, cfg):
        super().__init__(encoder, cfg)
        self.paper = self.settings.form == "paper"
        if self.paper and encoder.pooler != "mask":
            raise ValueError(f"osscse needs the encoder's pooler 'mask' (prompt [MASK] token), got {encoder.pooler!r}; "
                             f"[train.osscse] form = \"start-pooler\" trains it under the start's own pooler")
        # θ*: the starting weights (name -> detached copy), deliberately not registered as buffers.
        self.theta_star: dict[str, torch.Tensor] = {
            n: p.detach().clone() for n, p in self.encoder.named_parameters() if p.requires_grad}

    def collate(self, rows: list[dict]) -> dict:
        t1, t2 = self.settings.templates if self.paper else (None, None)
        tok = lambda texts, t: self.encoder.tokenize(texts, template=t, max_length=self.cfg.max_length)  # noqa: E731
        texts = [r["text"] for r in rows]
        anchors = tok(texts, t1)
        views = [anchors, tok(texts, t2) if self.paper else anchors]  # start-pooler: two dropout views
        both = [i for i, r in enumerate(rows) if r.get("paraphrase") and r.get("negation")]
        par = tok([rows[i]["paraphrase"] for i in both], t1) if both else None
        negn = tok([rows[i]["negation"] for i in both], t1) if both else None
        return {**joined(self.encoder, [*views, par, negn]), "trip_index": torch.tensor(both, dtype=torch.long)}

    def recall(self) -> torch.Tensor:
        """γ/2 · Σ (θ − θ*)²."""
        return recall_term(self.encoder.named_parameters(), self.theta_star, self.settings.recall_weight,
                           self.encoder.device)

    def forward(self, batch: dict):
        h, h2, hp, hn = self.encode_groups(batch)  # one forward: anchors (T1), anchors (T2 / view 2), par., neg.
        trip = batch["trip_index"].to(h.device)
        return osscse_loss(h, h2, hp, hn, trip, self.recall(), self.settings, self.cfg.temperature)


def recall_term(named_parameters, theta_star: dict[str, torch.Tensor], gamma: float, device) -> torch.Tensor:
    """l_r = γ/2 · Σ (θ − θ*)² over the parameters named in θ* (a copy moves to its parameter's device and dtype
    on first use, in θ* itself). A handful of kernels whatever the parameter count: one foreach subtraction, the
    differences flattened into one vector, its squared sum (a per-parameter sum was ~4 launches per parameter, a
    third of OssCSE's step on a GPU). Memory as before: the one vector backward keeps."""
    params, refs = [], []
    for n, p in named_parameters:
        ref = theta_star.get(n)
        if ref is None:
            continue
        if ref.device != p.device or ref.dtype != p.dtype:
            ref = theta_star[n] = ref.to(device=p.device, dtype=p.dtype)
        params.append(p)
        refs.append(ref)
    if not params:
        return torch.zeros((), device=device)
    diffs = torch._foreach_sub(params, refs)
    return 0.5 * gamma * torch.cat([d.reshape(-1) for d in diffs]).pow(2).sum()


def osscse_loss(h: torch.Tensor, h2: torch.Tensor, hp: torch.Tensor, hn: torch.Tensor, trip: torch.Tensor,
                l_r: torch.Tensor, settings, tau: float):
    """L = l_c + l_r + λ·l_m (the module docstring) on encoded vectors: h, h2 the two views of the anchors [B, d];
    hp, hn the paraphrases and negations [n, d] of the anchor rows `trip` [n]; l_r already computed (recall_term).
    The lean objective and the sentence-transformers loss (trainer/st_losses/osscse.py) both call this."""
    (G2,), (sizes,) = dist.gather_many([h2])
    sl = dist.local_slice(sizes)
    targets = torch.arange(sl.start, sl.stop, device=h.device)
    l_c = dist.global_mean(info_nce_terms(h, G2, targets, tau))
    if len(trip):
        sp, sn = cos_rows(h[trip], hp), cos_rows(h[trip], hn)  # float32 whatever the autocast
        margins = torch.relu(sn - sp + settings.alpha) + torch.relu(sp - sn - settings.beta)
    else:
        margins = h.new_zeros((0,))
    l_m = dist.global_mean(margins, h.device)
    loss = l_c + l_r + settings.margin_weight * l_m
    return loss, {"l_c": l_c.detach(), "l_m": l_m.detach(), "l_r": l_r.detach()}  # on the device: no host read
