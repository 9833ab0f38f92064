"""A stage's row memos in a run (rows.py describes the memo): where the memo lives, whether it is on for the stage's
resources, the facts that make a namespace, and the manifest's account of the rows it computed, reused and audited.
"""
from __future__ import annotations

from pathlib import Path

from contramine.pipeline.codeversion import code_version
from contramine.pipeline.memo.rows import NoMemo, RowMemo, namespace_hash
from contramine.pipeline.memo.packs import FORMAT


def memo_root(cfg) -> Path:
    """`runner.memo_dir`, or `<run.root>/.memo`: shared by every run under the same artifacts root (a folder on a
    shared filesystem serves a team or a cluster)."""
    return Path(cfg.runner.memo_dir) if cfg.runner.memo_dir is not None else Path(cfg.run.root) / ".memo"


def _on_gpu(plan: dict) -> list[str]:
    return [r for r, facts in plan.items() if isinstance(facts, dict) and str(facts.get("device", "")) == "cuda"]


def memo_state(stage, cfg, plan: dict) -> str:
    """"on", or why it is off: `runner.memo = "off"`, or "auto" (the default) with a resource of the stage on a GPU,
    where kernels are not batch-independent and a reused row could differ in its last bits from a fresh one."""
    if cfg.runner.memo == "off":
        return "off (runner.memo = off)"
    on_gpu = _on_gpu(plan)
    if cfg.runner.memo == "auto" and on_gpu:
        return f"off ({', '.join(on_gpu)} on a GPU: runner.memo = auto keeps it off there; \"on\" takes rows " \
               f"that may differ from a fresh run's in their last bits)"
    return "on"


def namespace_facts(stage, spec, cfg, plan: dict) -> dict:
    return {"format": FORMAT, "stage": stage.name, "memo": spec.name, "code": code_version(stage.module),
            **spec.facts(cfg, plan)}


def open_memo(stage, spec, cfg, plan: dict, force: bool = False) -> "RowMemo | NoMemo":
    """The stage's memo `spec` for this run; under `force` (`--force`) it reads nothing, so every row goes to the
    model again, and writes what it computes."""
    if memo_state(stage, cfg, plan) != "on":
        return NoMemo(stage.name, spec.name)
    memo = RowMemo(memo_root(cfg), stage.name, spec.name, namespace_facts(stage, spec, cfg, plan),
                   verify=cfg.runner.memo_verify, exact=not _on_gpu(plan), key=cfg.runner.memo_key_bytes())
    memo.read = not force
    return memo


def memo_manifest(stage, cfg, plan: dict, results: list[dict]) -> dict:
    """The manifest's `memo`: per memo, its namespace (what `contramine cache --unreferenced` keeps), whether it was
    on, and the rows this run's computed shards sent to the model, took from the memo, and recomputed to audit it."""
    out = {}
    for spec in stage.memos:
        state = memo_state(stage, cfg, plan)
        counts = [tuple(r.get("memo", {}).get(spec.name, (0, 0, 0))) + (0,) for r in results if not r["cached"]]
        out[spec.name] = {"namespace": f"{spec.name}-{namespace_hash(namespace_facts(stage, spec, cfg, plan))}"
                          if state == "on" else None, "state": state,
                          "rows_computed": sum(c[0] for c in counts), "rows_reused": sum(c[1] for c in counts),
                          "rows_audited": sum(c[2] for c in counts)}
    return out


