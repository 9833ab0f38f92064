"""OssCSE (Liu et al., "surface structure bias", EMNLP 2023, §4) for SentenceTransformerTrainer.

    L = l_c + l_r + λ·l_m
    l_c = (1/B) Σ_i −log e^{cos(h_i,h'_i)/τ} / Σ_j e^{cos(h_i,h'_j)/τ}            (two views of the anchor)
    l_m = mean_i [ max(cos(h,hⁿ) − cos(h,hᵖ) + α, 0) + max(cos(h,hᵖ) − cos(h,hⁿ) − β, 0) ]
    l_r = γ/2 · Σ (θ − θ*)²                                                        (θ* = the weights at construction)

The computation is trainer/objectives/osscse.py's osscse_loss and recall_term, the lean objective's.

Two forms, as the lean objective's [train.osscse] form:
- "paper": the vector is the last hidden state at the [MASK] token of a prompt template, read by this loss from the
  model's token embeddings (the model's own pooler is not used in training). The templates are in the data:
  make export FORMAT=osscse-prompt writes (anchor = T1(s), anchor_t2 = T2(s), paraphrase = T1(sᵖ),
  negation = T1(sⁿ)) with the literal `[MASK]` of BERT-family tokenizers. A row longer than the model's
  max_seq_length loses the end of its template to truncation; the loss cuts the sentence instead and puts the
  template's tail back (the lean trainer's rule: the sentence is truncated, never the template), so with
  max_seq_length = the lean train.max_length (32) the rows are the lean trainer's. Evaluate the result at the [MASK]
  of T1 too (a mean-pooled evaluation reads another vector).
- "start-pooler" (ours): no template, the model's own pooler; l_c's views are two dropout passes of the anchor.
  make export FORMAT=osscse-triplet: (anchor, paraphrase, negation).

θ*: the model's parameters when the loss is constructed — construct it after loading the start weights, before any
step. Deviation from the lean trainer: the exports hold only anchors that have BOTH a paraphrase and a negation, so
every row trains l_m (the lean trainer also trains l_c on the rest). Labels: none. Settings: alpha, beta,
margin_weight (λ), recall_weight (γ), form; the published values are the defaults.
"""
from __future__ import annotations

import torch
from torch import nn

from contramine.pipeline.citations import CITATIONS
from contramine.trainer.objectives.osscse import OssCSE, osscse_loss, recall_term
from contramine.trainer.st_losses.common import check_columns, embed, settings, two_views


class OssCSELoss(nn.Module):
    citation = CITATIONS["osscse"]  # its paper's BibTeX: SentenceTransformerTrainer writes it into the model card

    def __init__(self, model, temperature: float = 0.05, form: str = "paper", alpha: float = 0.05, beta: float = 0.2,
                 margin_weight: float = 1e-3, recall_weight: float = 2e-3):
        super().__init__()
        self.model, self.temperature = model, temperature
        self.settings = settings(OssCSE, form=form, alpha=alpha, beta=beta, margin_weight=margin_weight,
                                 recall_weight=recall_weight)
        # θ*: detached copies, not buffers (not saved with the loss, not trained)
        self.theta_star = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def template_tail(self, template: str) -> torch.Tensor:
        """The token ids of what follows {s} in a template ('" means [MASK] .')."""
        tok = self.model.tokenizer
        tail = template.split("{s}")[1].replace("[MASK]", tok.mask_token)
        return torch.tensor(tok(tail, add_special_tokens=False)["input_ids"])

    def keep_template(self, features: dict, template: str) -> dict:
        """Rows truncated through their template (no [MASK] left): the sentence cut instead, the tail put back before
        the final special token. A truncated row is full length, so the sentence loses exactly the tail's tokens."""
        ids = features["input_ids"]
        cut = ~(ids == self.model.tokenizer.mask_token_id).any(1)
        if not bool(cut.any()):
            return features
        tail = self.template_tail(template).to(ids.device)
        ids = ids.clone()
        length = ids.shape[1]
        for r in torch.nonzero(cut).flatten().tolist():
            last = int(features["attention_mask"][r].sum()) - 1  # the [SEP] truncation kept
            if last + 1 != length or last - len(tail) < 1:
                continue  # not truncated, or too short for the template: refused in mask_vectors
            ids[r, last - len(tail):last] = tail
        return {**features, "input_ids": ids}

    def mask_vectors(self, features: dict, template: str) -> torch.Tensor:
        """The last hidden state at each row's [MASK] token."""
        out = self.model(self.keep_template(features, template))
        ids = out["input_ids"]
        is_mask = ids == self.model.tokenizer.mask_token_id
        if not bool(is_mask.any(1).all()):
            raise ValueError("OssCSELoss(form='paper'): a row has no [MASK] token: the rows are not make export "
                             "FORMAT=osscse-prompt's, or model.max_seq_length is shorter than the template")
        return out["token_embeddings"][torch.arange(len(ids), device=ids.device), is_mask.int().argmax(1)]

    def recall(self) -> torch.Tensor:
        named = ((n.removeprefix("module."), p) for n, p in self.model.named_parameters())  # DDP-wrapped model
        return recall_term(named, self.theta_star, self.settings.recall_weight, self.model.device)

    def forward(self, sentence_features, labels=None):
        features = list(sentence_features)
        if self.settings.form == "paper":
            check_columns("OssCSELoss(form='paper')", features, 4, "osscse-prompt")
            t1, t2 = self.settings.templates  # the export's: T1, T2, then the paraphrase and the negation in T1
            h, h2, hp, hn = (self.mask_vectors(f, t) for f, t in zip(features, (t1, t2, t1, t1)))
        else:
            check_columns("OssCSELoss(form='start-pooler')", features, 3, "osscse-triplet")
            h, h2 = two_views(self.model, features[0])
            hp, hn = embed(self.model, features[1]), embed(self.model, features[2])
        every_row = torch.arange(len(h), device=h.device)
        loss, self.last_metrics = osscse_loss(h, h2, hp, hn, every_row, self.recall(), self.settings,
                                              self.temperature)
        return loss

    def get_config_dict(self):
        return {"temperature": self.temperature, **self.settings.model_dump(exclude={"templates"})}
