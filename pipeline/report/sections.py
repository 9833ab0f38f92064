"""The seven sections of the mining report (pipeline/report/page.py puts them on one page): each turns the run's
numbers (pipeline/report/queries.py) into Markdown lines and draws its plot into the report folder."""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import numpy as np

from contramine.pipeline.storage.atomic import atomic_file
from contramine.pipeline.report.timeline import caption, draw_gantt, run_timeline
from contramine.pipeline.markdown import cell, table
from contramine.pipeline.report.queries import (ABSENT, Run, backtranslation_flags, candidate_sample, chosen_cos,
                                                chosen_examples, negation_outcomes, overlap_by_source, overlap_stats,
                                                pool_peakedness, random_pair_cosines, rejected_by_reason,
                                                rejected_lines, triplet_examples, triplet_sample)
from contramine.pipeline.schema import SCHEMAS
from contramine.pipeline.text_distances import mer

matplotlib.use("Agg")  # headless: the report runs on servers and in tests
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402,F401

SCATTER_SAMPLE = 5_000  # points per kind in the MER-vs-cosine scatter
# DebCSE Table 4: mean lexical overlap of positives / negatives with their anchor.
PUBLISHED_OVERLAP = [("supervised NLI (published)", 0.38, 0.28), ("dropout-SimCSE (published)", 1.0, 0.09),
                     ("DebCSE (published)", 0.56, 0.21)]


FIGURES = ("rejected", "cosine_hist", "mer_vs_cos", "triplet_mer", "ipw_peakedness", "stage_seconds", "timeline")
PLOTS = re.compile("|".join(rf"{re.escape(f)}\.png" for f in FIGURES))  # what a rerun may remove from report/


@matplotlib.rc_context({"text.parse_math": False})  # stage names and texts are shown as written, never as TeX
def _figure(out: Path, name: str, title: str, xlabel: str, ylabel: str, draw, counts: str = "") -> str:
    assert name in FIGURES, name  # a new plot is named there, so that a rerun removes it when it no longer draws it
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    draw(ax)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    if counts:  # an axis of counts gets whole-number ticks only
        getattr(ax, f"{counts}axis").set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    fig.tight_layout()
    with atomic_file(out / f"{name}.png") as tmp:
        fig.savefig(tmp, format="png")  # the temp name ends in .tmp: say the format
    plt.close(fig)
    return f"![{title}]({name}.png)"


# ---- 1. summary -------------------------------------------------------------------------------------------------
def section_summary(run: Run, out: Path) -> list[str]:
    md = ["## 1. Summary", ""]
    kept, rejected = run.count("sentences"), rejected_lines(run)
    lines = run.cfg("corpus_lines", ("sentences",)) or run.manifests.get("sentences", {}).get("corpus_lines")
    md += [f"- corpus lines: **{lines if lines is not None else kept + rejected}**"
           + ("" if lines is not None else " (sentences kept + lines rejected)"),
           f"- sentences kept: **{kept}**" if run.present["sentences"] else f"- sentences: {ABSENT}",
           f"- lines rejected: **{rejected}**" if run.present["rejected"] else f"- rejected: {ABSENT}", ""]
    if run.present["rejected"] and rejected:
        reasons = rejected_by_reason(run)
        md += ["Rejected lines by reason:", ""] + table(["reason", "lines"], [list(r) for r in reasons])
        md += [_figure(out, "rejected", "Rejected corpus lines by reason", "lines", "reason",
                       lambda ax: ax.barh([r[0] for r in reasons][::-1], [r[1] for r in reasons][::-1]), "x"),
               "", "Each bar counts the corpus lines dropped by the sentence filter for that reason.", ""]
    md += ["Rows per table (Parquet rows as read; manifest rows as the stage recorded them):", ""]
    rows = [[t, str(run.count(t)) if run.present[t] else ABSENT,
             str(run.manifests.get(t, {}).get("rows", {}).get(t, "—"))] for t in SCHEMAS]
    md += table(["table", "rows", "manifest rows"], rows)
    if run.present["backtranslations"] and run.count("backtranslations"):
        flags = backtranslation_flags(run)
        md += ["Back-translations by degenerate flag (pipeline/degenerate.py; flagged outputs are neither "
               "positives nor paraphrases):", ""] + table(["flag", "outputs"], [list(r) for r in flags])
    return md


# ---- 2. cosine histograms ---------------------------------------------------------------------------------------
def section_cosine(run: Run, out: Path, seed: int) -> list[str]:
    md = ["## 2. Cosine of chosen pairs vs random pairs", ""]
    series = {"chosen positives": chosen_cos(run, "pos"), "chosen negatives": chosen_cos(run, "neg"),
              "random sentence pairs": random_pair_cosines(run, seed)}
    if not run.present["candidates"]:
        md.append(f"- candidates (chosen positives / negatives): {ABSENT}")
    if not run.present["embeddings"]:
        md.append(f"- embeddings (random pairs): {ABSENT}")
    if md[-1]:  # a list above: a blank line, or Markdown reads the table as the list's last item
        md.append("")
    lo, hi = run.number("lo", ("neighbours", "candidates")), run.number("hi", ("neighbours", "candidates"))
    rows = [[k, len(v), float(v.mean()) if len(v) else "—", float(np.median(v)) if len(v) else "—"]
            for k, v in series.items()]
    md += table(["pairs", "n", "mean cos", "median cos"], rows)
    if not any(len(v) for v in series.values()):
        return md + ["No cosines to plot.", ""]

    def draw(ax):
        low = min([-0.2] + [float(v.min()) for v in series.values() if len(v)])
        bins = np.linspace(low, 1.0, 61)
        for label, v in series.items():
            if len(v):
                ax.hist(v, bins=bins, density=True, histtype="step", lw=1.6, label=f"{label} (n={len(v)})")
        if lo is not None and hi is not None:
            ax.axvspan(lo, hi, color="grey", alpha=0.15, label=f"negative band [{lo}, {hi}]")

    md += [_figure(out, "cosine_hist", "Cosine to the anchor: chosen pairs vs random pairs", "cosine similarity",
                   "density", draw), ""]
    band = f"the shaded band is the negative pool's cosine band [{lo}, {hi}] from the config" if lo is not None \
        else "the negative band is not recorded in the manifests"
    return md + [f"Densities (each curve integrates to 1) of the cosine between an anchor and its chosen positives, "
                 f"its chosen negatives, and {len(series['random sentence pairs'])} random sentence pairs (seed {seed}); "
                 f"{band}. Negatives should sit right of the random curve (harder than random) and inside the band.", ""]


# ---- 3. lexical overlap -----------------------------------------------------------------------------------------
def section_overlap(run: Run, seed: int) -> list[str]:
    md = ["## 3. Lexical overlap with the anchor", ""]
    st = overlap_stats(run, seed)
    if st["pos"][2] == 0 and st["neg"][2] == 0:
        return md + [f"Mined pairs (pairs / candidates): {ABSENT}.", ""]
    ours = ["this run", st["pos"][0] if st["pos"][0] is not None else "—", st["neg"][0] if st["neg"][0] is not None else "—"]
    md += table(["training data", "positives", "negatives"], [ours] + [list(r) for r in PUBLISHED_OVERLAP])
    sampled = any(s[1] < s[2] for s in st.values())
    md += [f"Mean over pairs of |shared words| / words in the longer sentence (words as multisets: a word "
           f"shared twice counts twice; lower-cased whitespace tokens, punctuation kept), "
           f"this run on {st['pos'][1]} positive and {st['neg'][1]} negative pairs"
           f"{' (a seeded sample)' if sampled else ''}; the other rows are DebCSE Table 4. DebCSE's point: positives "
           f"should overlap less than dropout copies (1.0) and negatives more than random ones, so the model "
           f"cannot separate them by surface words alone.", ""]
    by_source = overlap_by_source(run, seed)
    if by_source:
        md += ["Where the numbers come from: each candidate pool against what IPW chose from it (candidates, mean "
               "cosine with the anchor, mean lexical overlap). When chosen ≈ pool, the sampling did not select on "
               "surface or meaning (IPW at T = 1 over a large pool is close to uniform): the pools set Table 4.", ""]
        md += table(["kind", "source", "pool", "pool cos", "pool overlap", "chosen", "chosen cos", "chosen overlap"],
                    [[r["kind"], r["source"], r["pool"], r["pool_cos"], r["pool_overlap"] if r["pool_overlap"] is not None
                      else "—", r["chosen"], r["chosen_cos"] if r["chosen_cos"] is not None else "—",
                      r["chosen_overlap"] if r["chosen_overlap"] is not None else "—"] for r in by_source])
    return md


# ---- 4. MER vs cosine -------------------------------------------------------------------------------------------
def section_mer(run: Run, out: Path, seed: int) -> list[str]:
    md = ["## 4. Surface change (MER) vs cosine", ""]
    if run.present["candidates"] and run.present["sentences"]:
        pts = {}
        for kind, label in (("pos", "positive candidates (paraphrases)"), ("neg", "negative candidates")):
            got = candidate_sample(run, kind, seed, SCATTER_SAMPLE)
            if got:
                pts[label] = (mer([g[0] for g in got], [g[1] for g in got]), np.array([g[2] for g in got]),
                              np.array([bool(g[3]) for g in got]))

        def draw(ax):
            for label, (m, c, ch) in pts.items():
                sc = ax.scatter(m[~ch], c[~ch], s=6, alpha=0.35, label=f"{label}, not chosen")
                ax.scatter(m[ch], c[ch], s=14, color=sc.get_facecolor()[0][:3], edgecolor="k", lw=0.4, label=f"{label}, chosen")

        if pts:
            md += [_figure(out, "mer_vs_cos", "Candidates: MER to the anchor vs cosine to the anchor",
                           "MER (word match error rate vs anchor)", "cosine (candidates.cos)", draw), "",
                   f"Each point is a candidate (up to {SCATTER_SAMPLE} per kind, seeded sample); cosine is the stored "
                   f"candidates.cos, MER is recomputed against the anchor. Good positives sit top-right (different "
                   f"words, same meaning), good negatives bottom-left (shared words, different meaning).", ""]
        else:
            md += ["The candidates have no stored cosine or text to plot.", ""]
    else:
        md += [f"- DebCSE candidates vs anchors (candidates, sentences): {ABSENT}", ""]
    return md + _triplet_mer(run, out, seed)


def _triplet_mer(run: Run, out: Path, seed: int) -> list[str]:
    md = ["### OssCSE triplets", ""]
    if run.present["negations"] and run.count("negations"):
        by = negation_outcomes(run)
        md += ["Negation outcomes (rule applied, or why the sentence was not negated):", ""]
        md += table(["rule", "not negated because", "sentences"], [list(r) for r in by])
    if not run.present["triplets"]:
        return md + [f"- triplets: {ABSENT}", ""]
    got = triplet_sample(run, seed)
    para = [g for g in got if g[1] is not None]
    neg = [g for g in got if g[2] is not None]
    m_para = mer([g[0] for g in para], [g[1] for g in para])
    m_neg = mer([g[0] for g in neg], [g[2] for g in neg])
    drift = [abs(m - g[3]) for m, g in zip(m_para, para) if g[3] is not None]
    md += [f"The paraphrase and negation texts are not embedded in this run (embeddings hold sentences only, and the "
           f"report loads no model), so no cosine is available: the MER distributions are shown instead. "
           f"{len(got)} triplets: {len(para)} with a paraphrase, {len(neg)} with a negation"
           + (f"; max |recomputed MER − para_mer| = {max(drift):.4f}." if drift else "."), ""]
    if not (para or neg):
        return md
    lo, hi = run.number("mer_lo", ("paraphrases", "triplets")), run.number("mer_hi", ("paraphrases", "triplets"))

    def draw(ax):
        bins = np.linspace(0, 1, 41)
        for label, v in (("paraphrase vs anchor", m_para), ("negation vs anchor", m_neg)):
            if len(v):
                ax.hist(v, bins=bins, alpha=0.55, label=f"{label} (n={len(v)})")
        if lo is not None and hi is not None:
            ax.axvspan(lo, hi, color="grey", alpha=0.15, label=f"paraphrase MER band [{lo}, {hi}]")

    med = lambda v: f"{np.median(v):.2f}" if len(v) else "—"  # noqa: E731
    return md + [_figure(out, "triplet_mer", "Triplets: MER of paraphrase and negation vs the anchor", "MER", "triplets", draw, "y"),
                 "", f"Share of words changed relative to the anchor (median: paraphrase {med(m_para)}, negation "
                 f"{med(m_neg)}). OssCSE wants the paraphrase (same meaning) to change more words than the negation "
                 f"(opposite meaning), so the surface cue points the wrong way and the model must learn meaning.", ""]


# ---- 5. IPW peakedness ------------------------------------------------------------------------------------------
def section_ipw(run: Run, out: Path) -> list[str]:
    md = ["## 5. How peaked the IPW sampling distributions are", ""]
    if not run.present["candidates"] or run.count("candidates") == 0:
        return md + [f"candidates: {ABSENT}.", ""]
    t = pool_peakedness(run)
    temp, norm = run.cfg("temperature", ("candidates",)), run.cfg("normalize", ("candidates",))
    kinds = sorted(set(t.column("kind").to_pylist()))
    kcol = np.array(t.column("kind").to_pylist())
    data = {k: {c: t.column(c).to_numpy()[kcol == k] for c in ("n", "times_uniform", "entropy_ratio")} for k in kinds}
    f4 = lambda v: f"{float(v):.4f}"  # noqa: E731 -- near-uniform pools differ from 1 in the third decimal
    rows = [[k, str(len(d["n"])), f"{np.mean(d['n']):.1f}", f4(np.mean(d["times_uniform"])), f4(np.median(d["times_uniform"])),
             f4(np.mean(d["entropy_ratio"])), f4(np.median(d["entropy_ratio"]))] for k, d in data.items()]
    md += [f"Sampling settings from the manifest: temperature T = **{temp if temp is not None else 'not recorded'}**, "
           f"normalize = **{norm if norm is not None else 'not recorded'}**.", ""]
    md += table(["kind", "pools", "mean pool size", "mean max p ×uniform", "median max p ×uniform",
                  "mean H(p)/log n", "median H(p)/log n"], rows)

    def draw(ax):
        allv = t.column("times_uniform").to_numpy()
        bins = np.linspace(1.0, max(float(allv.max()), 1.01), 31)  # shared bins so the kinds' bars line up
        for k, d in data.items():
            ax.hist(d["times_uniform"], bins=bins, alpha=0.55, label=f"{k} pools (n={len(d['n'])})")
        ax.axvline(1.0, color="k", ls="--", lw=1, label="uniform sampling (1.0)")

    md += [_figure(out, "ipw_peakedness", "IPW sampling: most likely candidate vs uniform",
                   "max p / (1/n)  (1 = uniform)", "anchor pools", draw, "y"), "",
           "For each anchor's candidate pool, how many times more likely the most likely candidate is than under "
           "uniform sampling; the table adds the entropy ratio H(p)/log n (1 = uniform, 0 = one candidate certain).", ""]
    worst = max(float(np.mean(d["times_uniform"])) for d in data.values())
    setting = f"with T = {temp} and {norm} normalisation" if temp is not None else "with these settings"
    if worst < 1.1:
        verdict = (f"{setting} the sampling is close to uniform: the favourite candidate is at most {worst:.3f}× as "
                   f"likely as a uniform draw on average, so the IPW weights barely change which candidates are chosen "
                   f"(lower T, or normalize = none, sharpens it).")
    elif worst < 2:
        verdict = f"{setting} the sampling is mildly peaked (favourite up to {worst:.2f}× uniform on average)."
    else:
        verdict = f"{setting} the sampling is clearly peaked (favourite up to {worst:.2f}× uniform on average)."
    return md + [verdict[0].upper() + verdict[1:], ""]


# ---- 6. examples ------------------------------------------------------------------------------------------------
def section_examples(run: Run, seed: int) -> list[str]:
    md = ["## 6. Examples", "", "### Anchors with their chosen positives (+) and negatives (−)"]
    if run.present["candidates"] and run.present["sentences"]:
        got = chosen_examples(run, seed, anchors=5)
        last = None
        for sid, anchor, kind, text, p in got:
            if sid != last:
                md += ["", f"**sid {sid}:** {cell(anchor, limit=300)}"]
                last = sid
            md.append(f"- {'+' if kind == 'pos' else '−'} p = {p:.4f}: {cell(text, limit=300)}")
        md += [""] if got else ["No chosen candidates.", ""]
    else:
        md += [f"candidates / sentences: {ABSENT}.", ""]
    md += ["### Triplets (anchor, paraphrase, negation)", ""]
    if not run.present["triplets"]:
        return md + [f"triplets: {ABSENT}.", ""]
    got = triplet_examples(run, seed, 5)
    return md + table(["sid", "anchor", "paraphrase", "negation", "para MER"],
                       [[str(r[0]), r[1], r[2], r[3], r[4] if r[4] is not None else "—"] for r in got])


# ---- 7. stage timings -------------------------------------------------------------------------------------------
def section_timings(run: Run, out: Path) -> list[str]:
    md = ["## 7. Seconds per stage", ""]
    stages: dict[str, dict] = {}
    for name, m in run.manifests.items():  # a stage writing several tables has the same manifest in each
        s = stages.setdefault(str(m.get("stage", name)), {"seconds": 0.0, "tables": []})
        s["seconds"] = max(s["seconds"], float(m.get("seconds") or 0.0))
        s["tables"].append(name)
    if not stages:
        return md + [f"manifests: {ABSENT}.", ""]
    names = list(stages)
    md += table(["stage", "seconds", "tables written"], [[n, stages[n]["seconds"], ", ".join(stages[n]["tables"])] for n in names])
    md += [f"Total: {sum(s['seconds'] for s in stages.values()):.1f} s.", ""]
    md += [_figure(out, "stage_seconds", "Wall-clock seconds per stage", "seconds", "stage",
                   lambda ax: ax.barh(names[::-1], [stages[n]["seconds"] for n in names][::-1])), "",
           "Seconds each stage recorded in its `_manifest.json` (a cached stage records the time of the run that made it).", ""]
    timeline = run_timeline(run.dir)
    if timeline.spans:
        md += [_figure(out, "timeline", "When each stage's jobs ran", "seconds from the first job", "stage",
                       lambda ax: draw_gantt(ax, timeline)), "",
               f"The last run of each stage (its manifest's `timeline`): a bar per job, its colour the worker, "
               f"hatched while it held the device; {caption(timeline)}. Stages that do not read each other "
               f"overlap (the mine is a graph: docs/scale-and-clusters.md).", ""]
    return md
