"""Which back-translations serve which method: a chain's role (`ChainCfg.role`) and the degenerate-output flag decide
whether its rows are DebCSE positive candidates or OssCSE paraphrases. Read by the `scores` and `paraphrases`
stages; below every stage, no model imported."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def rows_serving(backtranslations: pa.Table, role: str) -> pa.Table:
    """The back-translations whose chain serves `role` ("positives" or "paraphrases"), degenerate ones left out."""
    if not backtranslations.num_rows:
        return backtranslations
    serving = pc.is_in(backtranslations.column("role"), pa.array([role, "both"]))
    if "flag" in backtranslations.column_names:
        serving = pc.and_(serving, pc.is_null(backtranslations.column("flag")))
    return backtranslations.filter(serving)


def positive_sources(cfg, chains: dict) -> list[str]:
    """Where DebCSE's positive candidates come from in this run (scores.positives, with "auto" resolved against
    the run's `chains` plan: its `used` chains)."""
    if cfg.scores.positives != "auto":
        return list(cfg.scores.positives)
    return ["backtranslation"] if any(c.name in chains["used"] for c in cfg.backtranslate.chains_for("positives")) \
        else ["noise"]
