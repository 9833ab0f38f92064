"""Prompt templates that more than one layer reads: OssCSE's two PromptBERT templates (OssCSE §5), used by the
lean objective (trainer/objectives/osscse.py, its [train.osscse] templates default) and by the `osscse-prompt`
export (pipeline/export.py), which wraps the rows in them so sentence-transformers trains on the same inputs.

`{s}` is where the sentence goes; `[MASK]` is the token whose last hidden state is the sentence vector."""
from __future__ import annotations

OSSCSE_TEMPLATES = ('This sentence : "{s}" means [MASK] .', 'This sentence of "{s}" means [MASK] .')


def fill(template: str, sentence: str) -> str:
    """The sentence put into the template (at `{s}`; no other formatting, so braces in the text are kept)."""
    return template.replace("{s}", sentence)
