"""The compare's numbers and pictures (trainer/compare.py runs the training): the paired bootstrap on STS-B test,
mean ± std over seeds, table.md, bootstrap.md and the plots."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from contramine.pipeline.storage.atomic import atomic_file
from contramine.pipeline.markdown import cell

STS_KEYS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness", "avg"]
STS_HEAD = ["STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "Avg."]


def _spearman_rows(pred: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Spearman of every row of pred (B×n) against the same row of gold (average ranks for ties)."""
    from scipy.stats import rankdata

    rp, rg = rankdata(pred, axis=1), rankdata(gold, axis=1)
    rp -= rp.mean(1, keepdims=True)
    rg -= rg.mean(1, keepdims=True)
    den = np.sqrt((rp ** 2).sum(1) * (rg ** 2).sum(1))
    return np.divide((rp * rg).sum(1), den, out=np.zeros(len(den)), where=den > 0)


def paired_bootstrap(gold: np.ndarray, ours: list[np.ndarray], base: list[np.ndarray], n_boot: int,
                     seed: int = 0) -> dict:
    """Δ = Spearman(ours) − Spearman(base) ×100 on the same resampled pairs (seed k of ours against seed k of the
    baseline). Per seed and pooled (the mean Δ over seeds on each resample): Δ, 95% interval, and p = the share
    of resamples with Δ ≤ 0 (one-sided: how often the gain vanishes)."""
    gold = np.asarray(gold, np.float64)
    idx = np.random.default_rng(seed).integers(0, len(gold), size=(n_boot, len(gold)))
    g = gold[idx]
    per_seed, deltas = [], []
    for a, b in zip(ours, base):
        d = 100 * (_spearman_rows(np.asarray(a)[idx], g) - _spearman_rows(np.asarray(b)[idx], g))
        full = 100 * (_spearman_rows(np.asarray(a)[None], gold[None])[0] - _spearman_rows(np.asarray(b)[None],
                                                                                           gold[None])[0])
        deltas.append(d)
        per_seed.append(_summary(full, d))
    pooled_full = float(np.mean([s["delta"] for s in per_seed])) if per_seed else 0.0
    return {"per_seed": per_seed, "pooled": _summary(pooled_full, np.mean(deltas, axis=0)) if deltas else None,
            "n_boot": n_boot, "n_pairs": len(gold)}


def _summary(full: float, d: np.ndarray) -> dict:
    lo, hi = np.percentile(d, [2.5, 97.5])
    return {"delta": round(float(full), 2), "ci95": [round(float(lo), 2), round(float(hi), 2)],
            "p_le_0": round(float((d <= 0).mean()), 4)}


def mean_std(values: list) -> tuple[float | None, float | None]:
    v = [x for x in values if x is not None]
    if not v:
        return None, None
    return round(float(np.mean(v)), 2), round(float(np.std(v, ddof=1)), 2) if len(v) > 1 else 0.0


# ------------------------------------------------------------------------------------------------ report
def summarise(rows: list[dict]) -> dict:
    """Mean and std over seeds of every number in the table, for one objective (or the start model: one row)."""
    res = [r["results"] for r in rows]
    out = {k: mean_std([x["sts"].get(k) for x in res]) for k in STS_KEYS}
    out["stsb_dev"] = mean_std([x["dev"].get("STSBenchmark/dev") for x in res])
    out["alignment"] = mean_std([x["align_uniform"]["alignment"] for x in res])
    out["uniformity"] = mean_std([x["align_uniform"]["uniformity"] for x in res])
    out["probe_paraphrase"] = mean_std([(x.get("probe") or {}).get("paraphrase_mean") for x in res])
    out["probe_negation"] = mean_std([(x.get("probe") or {}).get("negation_mean") for x in res])
    out["cont"] = mean_std([x["splits"]["weighted"]["spearman_cont"] for x in res])
    out["oppn"] = mean_std([x["splits"]["weighted"]["spearman_oppn"] for x in res])
    return out


def _ms(pair: tuple) -> str:
    m, s = pair
    return "—" if m is None else (cell(m) if not s else f"{cell(m)} ± {cell(s)}")


def _delta(t: dict | None) -> str:
    t = (t or {}).get("pooled")
    return f"{t['delta']:+.2f} [{t['ci95'][0]:+.2f}, {t['ci95'][1]:+.2f}], {t['p_le_0']:.3f}" if t else "—"


def _inputs(first: dict, mined: dict | None) -> str:
    text = "+".join(first.get("inputs", []))
    if mined and {"pairs", "embeddings"} & set(first.get("inputs", [])):
        text += f" (mined with {mined['model']})"
    if first.get("data_notes"):
        text += "; " + "; ".join(first["data_notes"])
    return text or "none (not trained)"


def table_markdown(starts: dict, summaries: dict, tests: dict, rows: dict, baseline: str,
                   vs_start: dict | None = None, meta: dict | None = None) -> str:
    """One start row per pooler/prompt (`starts`: label -> summary), then every row: its pooler, the 7 STS numbers,
    ..., Δ STS-B against its own start and against the baseline. `meta`: row -> {"start": label, "pooling": text,
    "mined": mined_with(...)}."""
    vs_start, meta = vs_start or {}, meta or {}
    head = ["model", "pooler", *STS_HEAD, "STS-B dev", "align", "uniform", "probe para / neg", "Cont. / Oppn.",
            "Δ STS-B vs its start [95% CI], P(Δ≤0)", f"Δ STS-B vs {baseline} [95% CI], P(Δ≤0)", "inputs"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 4) + "---:|---|"]
    named = [(label, s, True) for label, s in starts.items()] + [(n, s, False) for n, s in summaries.items()]
    for name, s, is_start in named:
        m = meta.get(name, {})
        inputs = "none (not trained)" if is_start else _inputs(rows.get(name, [{}])[0], m.get("mined"))
        lines.append(f"| {name} | {m.get('pooling', '')} | " + " | ".join(_ms(s[k]) for k in STS_KEYS)
                     + f" | {_ms(s['stsb_dev'])} | {_ms(s['alignment'])} | {_ms(s['uniformity'])} | "
                     f"{_ms(s['probe_paraphrase'])} / {_ms(s['probe_negation'])} | {_ms(s['cont'])} / "
                     f"{_ms(s['oppn'])} | {_delta(vs_start.get(name))} | {_delta(tests.get(name))} | {inputs} |")
    return "\n".join(lines)


def bootstrap_markdown(rows: dict, tests: dict, vs_start: dict, start_of: dict, baseline: str, n_boot: int) -> str:
    """bootstrap.md: every row's paired bootstrap on STS-B test, per seed and pooled, against its start and the
    baseline."""
    seeds = next(iter(rows.values()))
    lines = [f"Paired bootstrap on STS-B test ({n_boot} resamples of the sentence pairs, the same for both sides): "
             "Δ = Spearman ×100 of the row minus the other side's, [95% interval], P(Δ≤0).", "",
             "| row | against | " + " | ".join(f"seed {r['seed']}" for r in seeds) + " | pooled |",
             "|---|---|" + "---:|" * (len(seeds) + 1)]
    fmt = lambda t: f"{t['delta']:+.2f} [{t['ci95'][0]:+.2f}, {t['ci95'][1]:+.2f}], {t['p_le_0']:.3f}"  # noqa: E731
    for name in rows:
        for against, res in ((start_of[name], vs_start.get(name)), (baseline, tests.get(name))):
            if res:
                lines.append(f"| {name} | {against} | " + " | ".join(fmt(t) for t in res["per_seed"])
                             + f" | {fmt(res['pooled'])} |")
    return "\n".join(lines)


def save_png(fig, path: Path) -> None:
    """fig as a PNG that replaces `path` (a symlink planted there goes; its target is never written)."""
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")  # the temp name ends in .tmp: say the format


def plots(rows: dict[str, list[dict]], starts: dict, summaries: dict, out: Path, start_of: dict,
          tests: dict | None = None, baseline: str | None = None) -> list[str]:
    """dev_curves.png (one panel per start, each run from its start's dev score at step 0: a [MASK]-pooled start 40
    points under the mean-pooled one would flatten every other curve on a shared axis), sts_bars.png (every start,
    then every row) and, given the paired bootstraps against the baseline (`tests`), delta_stsb.png: each row's
    pooled Δ on STS-B test with its 95% interval. `starts`: label -> summary; `start_of`: row -> its start's label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour_of = {name: colours[c % len(colours)] for c, name in enumerate(rows)}
    panels = [label for label in starts if any(start_of[n] == label for n in rows)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels) + 1, 5), squeeze=False)
    for ax, label in zip(axes[0], panels):
        dev0 = starts[label]["stsb_dev"][0]
        for name in (n for n in rows if start_of[n] == label):
            for k, r in enumerate(rows[name]):
                if r["dev_curve"]:
                    steps, dev = zip(*([[0, dev0]] if dev0 is not None else []) + r["dev_curve"])
                    ax.plot(steps, dev, color=colour_of[name], linestyle=["-", "--", ":", "-."][k % 4],
                            marker="o", markersize=3, label=f"{name} seed {r['seed']}")
        ax.set(xlabel="step", title=f"from {label}")
        ax.legend(fontsize=7, ncol=1 + (len(ax.get_lines()) > 9))
    axes[0][0].set_ylabel("STS-B dev Spearman ×100")
    fig.suptitle("dev score against step, one panel per start (one line per seed)")
    fig.tight_layout()
    save_png(fig, out / "dev_curves.png")
    plt.close(fig)

    models = [*starts.items(), *summaries.items()]
    fig, ax = plt.subplots(figsize=(12, 4.8))
    width = 0.8 / len(models)
    x = np.arange(len(STS_KEYS))
    greys = ["0.6", "0.8", "0.4", "0.9"]
    for i, (name, s) in enumerate(models):
        mean = [s[k][0] if s[k][0] is not None else np.nan for k in STS_KEYS]
        std = [s[k][1] or 0 for k in STS_KEYS]
        colour = greys[i % len(greys)] if i < len(starts) else colour_of.get(name, colours[0])
        ax.bar(x + (i - (len(models) - 1) / 2) * width, mean, width, yerr=std, capsize=2, label=name, color=colour)
    ax.set_xticks(x, STS_HEAD)
    ax.set(ylabel="Spearman ×100", title="STS test sets: mean over seeds, error bars = std")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_png(fig, out / "sts_bars.png")
    plt.close(fig)
    if not tests:
        return ["dev_curves.png", "sts_bars.png"]

    names = [n for n in rows if n in tests]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.8))
    ticks = []
    for y, name in enumerate(reversed(names)):
        d, (lo, hi) = tests[name]["pooled"]["delta"], tests[name]["pooled"]["ci95"]
        ax.errorbar(d, y, xerr=[[d - lo], [hi - d]], fmt="o", color=colour_of[name], capsize=4)
        ticks.append(f"{name}  {d:+.2f} [{lo:+.2f}, {hi:+.2f}]")
    ax.axvline(0, color="0.5", linewidth=1)
    ax.set_yticks(range(len(names)), ticks)
    ax.set(xlabel=f"Δ STS-B test vs {baseline} (Spearman ×100): pooled over seeds,\n95% paired bootstrap interval "
                  f"on the same resampled sentence pairs", title=f"each row against {baseline}")
    fig.tight_layout()
    save_png(fig, out / "delta_stsb.png")
    plt.close(fig)
    return ["dev_curves.png", "sts_bars.png", "delta_stsb.png"]


# ------------------------------------------------------------------------------------------------ driver
