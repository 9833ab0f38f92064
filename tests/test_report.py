"""The mining report on a small synthetic run: every section, valid PNGs, exact numbers, absent tables."""
import json
import subprocess
import sys
import re
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contramine.pipeline.report import ABSENT, Run, main, overlap_stats, pool_peakedness, random_pair_cosines, write_report
from contramine.pipeline.schema import SCHEMAS

WORDS = "the cat dog sat ran on a mat big red house near river tree old man walked quickly slowly home".split()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write(run, name, rows, stage, seconds, config=None):
    d = run / name
    d.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMAS[name]), d / "part-00000-of-00001.parquet")
    (d / "_manifest.json").write_text(json.dumps({"stage": stage, "seconds": seconds, "rows": {name: len(rows)},
                                                  "config": config or {}, "table": name, "shards": 1}))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """30 sentences, 8 anchors with pos/neg pools; anchor 0's pools have uniform p. No variants/backtranslations."""
    rng = np.random.default_rng(7)
    run = tmp_path_factory.mktemp("artifacts") / "synthetic"
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 9)))) for _ in range(30)]
    _write(run, "sentences", [{"sid": i, "text": t, "n_words": len(t.split()), "line_no": i + 2} for i, t in enumerate(texts)],
           "sentences", 0.4)
    # a shard of an older 2-shard layout the manifest no longer names: must not be counted
    pq.write_table(pa.Table.from_pylist([{"sid": 99, "text": "stale", "n_words": 1, "line_no": 0}], schema=SCHEMAS["sentences"]),
                   run / "sentences" / "part-00001-of-00002.parquet")
    _write(run, "rejected", [{"line_no": 0, "text": "", "reason": "empty"}, {"line_no": 1, "text": "hi", "reason": "too_short"},
                             {"line_no": 40, "text": "x", "reason": "too_short"}], "sentences", 0.4)
    emb = rng.normal(size=(30, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    _write(run, "embeddings", [{"sid": i, "emb": e.tolist()} for i, e in enumerate(emb)], "embed", 2.5)
    _write(run, "neighbours", [{"sid": 0, "cand_sid": 1, "cos": 0.5, "rank": 0}], "neighbours", 1.0,
           {"neighbours": {"lo": 0.25, "hi": 0.75, "pool_size": 4}})
    cands, pairs, triplets, negs = [], [], [], []
    for a in range(8):
        pos, neg = [], []
        for kind, n in (("neg", 4), ("pos", 3)):
            p = np.full(n, 1 / n) if a == 0 else rng.dirichlet(np.ones(n))
            for k in range(n):
                cs = (a + 1 + k) % 30 if kind == "neg" else None
                text = texts[cs] if kind == "neg" else texts[a] + f" {WORDS[k]}"
                chosen = k < 2
                cands.append({"sid": a, "kind": kind, "cand_sid": cs, "text": text, "source": "noise" if cs is None else "knn",
                              "edit": 0.5, "cos": float(emb[a] @ emb[cs]) if cs is not None else 0.9 - 0.1 * k,
                              "s_sur": 0.9, "s_sem": 0.1, "p_tilde": 0.8, "p": float(p[k]), "chosen": chosen})
                if chosen:
                    (neg if kind == "neg" else pos).append(text)
        pairs.append({"sid": a, "anchor": texts[a], "positives": pos, "negatives": neg})
        negs.append({"sid": a, "text": texts[a].replace(" ", " not ", 1), "rule": "VBZ", "reason": None})
        triplets.append({"sid": a, "anchor": texts[a], "paraphrase": None if a == 3 else "well " + texts[a],
                         "negation": negs[-1]["text"], "para_mer": None, "para_chain": "en-de-en"})
    negs.append({"sid": 9, "text": None, "rule": None, "reason": "no verbal root"})
    _write(run, "candidates", cands, "sample", 0.7, {"ipw": {"temperature": 1.0, "normalize": "softmax"}})
    _write(run, "pairs", pairs, "sample", 0.7)
    _write(run, "negations", negs, "negate", 3.0)
    _write(run, "triplets", triplets, "triplets", 0.2, {"paraphrases": {"mer_lo": 0.15, "mer_hi": 0.6}})
    return {"dir": run, "pairs": pairs}


def _overlap(a, b):  # DebCSE Table 4's measure, written out independently of contramine.pipeline.text_distances
    wa, wb = a.lower().split(), b.lower().split()
    return sum((Counter(wa) & Counter(wb)).values()) / max(len(wa), len(wb))  # words as multisets


def test_report_sections_plots_and_absent_tables(run, tmp_path):
    index = write_report(run["dir"], tmp_path / "rep", seed=3)
    md = index.read_text()
    for n, title in enumerate(["Summary", "Cosine", "Lexical overlap", "MER", "IPW", "Examples", "Seconds per stage"], 1):
        assert re.search(rf"^## {n}\. .*{title}", md, re.M), title
    images = re.findall(r"!\[[^\]]+\]\(([^)]+\.png)\)", md)
    assert {"rejected.png", "cosine_hist.png", "mer_vs_cos.png", "triplet_mer.png", "ipw_peakedness.png",
            "stage_seconds.png"} <= set(images)
    for name in images:
        assert (tmp_path / "rep" / name).read_bytes()[:8] == PNG_MAGIC
    assert f"| backtranslations | {ABSENT} |" in md and f"| variants | {ABSENT} |" in md
    assert "| too_short | 2 |" in md and "corpus lines: **33**" in md
    assert "T = **1.0**" in md and "normalize = **softmax**" in md and "sampling is clearly peaked" in md
    assert "no cosine is available" in md and "[0.25, 0.75]" in md
    assert md.count("**sid ") == 5 and "| sid | anchor | paraphrase | negation |" in md
    assert "| sample |" in md and "| negate | 3.000 |" in md
    assert_tables_stand_apart(md)


def test_overlap_table_equals_direct_computation(run, tmp_path):
    want = {k: np.mean([_overlap(p["anchor"], t) for p in run["pairs"] for t in p[col]])
            for k, col in (("pos", "positives"), ("neg", "negatives"))}
    got = overlap_stats(Run(run["dir"]))
    by_sets = np.mean([len(set(p["anchor"].split()) & set(t.split())) / max(len(p["anchor"].split()), len(t.split()))
                       for p in run["pairs"] for t in p["positives"]])
    assert by_sets < want["pos"] - 0.01  # the fixture repeats words: a set-based count would not pass
    for k in want:
        assert got[k][0] == pytest.approx(want[k]) and got[k][1] == got[k][2] == 16
    md = write_report(run["dir"], tmp_path / "rep").read_text()
    assert f"| this run | {want['pos']:.3f} | {want['neg']:.3f} |" in md
    assert "| DebCSE (published) | 0.560 | 0.210 |" in md


def test_overlap_by_source_pool_against_chosen(run):
    """Table 4's explanation: each pool (kind, source) against what was chosen from it, by direct computation."""
    from contramine.pipeline.report import overlap_by_source

    texts = {p["sid"]: p["anchor"] for p in run["pairs"]}
    cands = pq.read_table(run["dir"] / "candidates" / "part-00000-of-00001.parquet").to_pylist()
    sent = {r["sid"]: r["text"] for r in pq.read_table(run["dir"] / "sentences" / "part-00000-of-00001.parquet").to_pylist()}
    got = {(r["kind"], r["source"]): r for r in overlap_by_source(Run(run["dir"]))}
    assert set(got) == {("pos", "noise"), ("neg", "knn")}
    for (kind, source), r in got.items():
        rows = [c for c in cands if c["kind"] == kind and c["source"] == source]
        text = lambda c: c["text"] if c["text"] is not None else sent[c["cand_sid"]]  # noqa: E731
        assert r["pool"] == len(rows) and r["chosen"] == sum(c["chosen"] for c in rows)
        assert r["pool_overlap"] == pytest.approx(np.mean([_overlap(texts[c["sid"]], text(c)) for c in rows]))
        assert r["chosen_overlap"] == pytest.approx(np.mean([_overlap(texts[c["sid"]], text(c)) for c in rows
                                                             if c["chosen"]]))
        assert r["pool_cos"] == pytest.approx(np.mean([c["cos"] for c in rows]))


def test_peakedness_uniform_is_one(run):
    t = pool_peakedness(Run(run["dir"])).to_pylist()
    for row in (r for r in t if r["sid"] == 0):
        assert row["times_uniform"] == pytest.approx(1.0) and row["entropy_ratio"] == pytest.approx(1.0)
    others = [r for r in t if r["sid"] != 0]
    assert len(others) == 14 and all(r["times_uniform"] > 1.0 and r["entropy_ratio"] < 1.0 for r in others)


def test_random_pairs_seeded_and_never_self(run):
    r = Run(run["dir"])
    a, b = random_pair_cosines(r, seed=1), random_pair_cosines(r, seed=1)
    assert len(a) == 435 and np.array_equal(a, b)  # 30 sentences: draws capped at the 435 distinct pairs
    assert np.all(a < 0.9999) and np.all(a >= -1.0001)


def test_empty_run_reports_everything_absent(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    main([str(tmp_path / "empty"), "--out", str(tmp_path / "out")])
    index = tmp_path / "out" / "index.md"
    assert capsys.readouterr().out.strip() == str(index)
    md = index.read_text()
    assert all(f"| {t} | {ABSENT} |" in md for t in SCHEMAS)
    assert all(f"## {n}." in md for n in range(1, 8)) and "triplets: " + ABSENT in md
    assert_tables_stand_apart(md)


def assert_tables_stand_apart(md: str) -> None:
    """Every Markdown table starts after a blank line or a heading: right under a list item or a paragraph line,
    Markdown reads it as that item's or paragraph's text (a report of a run with some tables absent did so)."""
    lines = md.splitlines()
    for i in range(1, len(lines)):
        if lines[i].startswith("|") and not lines[i - 1].startswith("|"):
            assert lines[i - 1] == "" or lines[i - 1].startswith("#"), (i, lines[i - 1], lines[i])


HOSTILE = ["<img src=x onerror=alert(1)> a | b", "**loud** _quiet_ `code` [link](http://example.com)",
           "two\nlines &amp; $x$ ~~gone~~ \\ end"]


def test_corpus_text_on_the_page_is_text(tmp_path):
    """Sentences holding HTML, Markdown, pipes and line breaks: on the page each is one escaped line, every table row
    keeps its columns, and no tag, link or emphasis of the corpus survives as Markdown."""
    run = tmp_path / "hostile"
    texts = [h + f" {i}" for i, h in enumerate(HOSTILE)]
    _write(run, "sentences", [{"sid": i, "text": t, "n_words": 3, "line_no": i} for i, t in enumerate(texts)],
           "sentences", 0.1)
    _write(run, "candidates", [{"sid": 0, "kind": k, "cand_sid": None, "text": texts[1 if k == "pos" else 2],
                                "source": "noise", "edit": 0.5, "cos": 0.5, "s_sur": 0.5, "s_sem": 0.5,
                                "p_tilde": 0.5, "p": 1.0, "chosen": True} for k in ("pos", "neg")], "sample", 0.1)
    _write(run, "triplets", [{"sid": i, "anchor": t, "paraphrase": texts[(i + 1) % 3], "negation": texts[(i + 2) % 3],
                              "para_mer": 0.3, "para_chain": "de"} for i, t in enumerate(texts)], "triplets", 0.1)
    md = write_report(run).read_text()
    examples = md[md.index("## 6. Examples"):md.index("## 7.")]
    assert not re.search(r"(?<!\\)<img|(?<!\\)\]\(http|\*\*loud", examples)  # no tag, link, emphasis unescaped
    assert "\\<img src=x onerror=alert(1)\\> a \\| b 0" in examples
    assert "\\*\\*loud\\*\\* \\_quiet\\_ \\`code\\` \\[link\\](http\\://example.com) 1" in examples
    assert "two lines \\&amp; \\$x\\$ \\~\\~gone\\~\\~ \\\\ end 2" in examples
    rows = [ln for ln in examples.splitlines() if ln.startswith("| ") and "sid |" not in ln]
    assert len(rows) == 3 and all(len(re.findall(r"(?<!\\)\|", r)) == 6 for r in rows)  # 5 columns each
    # rendered (CommonMark + GFM tables and strikethrough): the characters, and no element the corpus wrote
    gfm = pytest.importorskip("markdown_it").MarkdownIt("commonmark").enable(["table", "strikethrough"])
    html = gfm.render(examples)
    assert not re.search(r"<(img|a|em|code|del|br)\b", html) and html.count("<strong>") == 1  # the page's "sid 0"
    assert "&lt;img src=x onerror=alert(1)&gt; a | b 0" in html and "**loud** _quiet_ `code` [link](http" in html


def test_bidi_controls_are_shown_as_code_points_and_bare_urls_are_not_links():
    """A right-to-left override in a corpus line would reorder what the page shows after it; a bare URL, `www.` name
    or address would become a link (GFM's extended autolinks): the page shows the code point, and the link's `:`,
    `.` or `@` is escaped, so it renders as the characters it is."""
    from contramine.pipeline.markdown import escape

    line = ("pay \u202egnp.exe\u202c to https://evil.example/x, www.evil.example or me@evil.example "
            "\u2066x\u2069\u200f\u061c")
    out = escape(line)
    assert not re.search("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]", out)
    assert "(U+202E)gnp.exe(U+202C)" in out and "(U+2066)x(U+2069)(U+200F)(U+061C)" in out
    assert "https\\://evil.example/x" in out and "www\\.evil.example" in out and "me\\@evil.example" in out
    html = pytest.importorskip("markdown_it").MarkdownIt("commonmark").render(out)
    assert "<a" not in html and "https://evil.example/x, www.evil.example or me@evil.example" in html


def test_a_stage_name_with_tex_and_long_texts_are_shown_as_written(tmp_path):
    """A manifest `stage` of `$\\undefinedmacro{x}$` is drawn as those characters (no mathtext parse, no crash), and
    an example sentence is cut at the 300 characters the examples ask for."""
    run = tmp_path / "tex"
    long_text = " ".join(["word"] * 100)  # 499 characters
    _write(run, "sentences", [{"sid": 0, "text": long_text, "n_words": 100, "line_no": 0}], r"$\undefinedmacro{x}$", 0.1)
    _write(run, "candidates", [{"sid": 0, "kind": "pos", "cand_sid": None, "text": long_text, "source": "noise",
                                "edit": 0.5, "cos": 0.5, "s_sur": 0.5, "s_sem": 0.5, "p_tilde": 0.5, "p": 1.0,
                                "chosen": True}], "sample", 0.1)
    md = write_report(run).read_text()
    assert "| \\$\\\\undefinedmacro{x}\\$ | 0.100 | sentences |" in md and (run / "report" / "stage_seconds.png").is_file()
    examples = md[md.index("## 6. Examples"):md.index("## 7.")]
    assert f"**sid 0:** {long_text[:299]}…" in examples and f"p = 1.0000: {long_text[:299]}…" in examples


def test_the_mines_headline_counts_what_each_table_committed_and_opens_only_what_its_lines_read(run):
    """`headline` ends every mine: its rows per table are each table's committed rows (the stale shard its manifest
    no longer names is not counted), and only the tables its cosine and overlap lines read become views, so a mine's
    last step does not open and hash every table of the run."""
    from contramine.pipeline.report import headline
    from contramine.pipeline.storage.tables import RunTables

    md = headline(run["dir"])
    counts = dict(re.findall(r"^\| (\w+) \| ([\d,]+) \|$", md, re.M))
    tables = RunTables(run["dir"])
    assert counts and {t: int(n.replace(",", "")) for t, n in counts.items()} == \
        {t: tables.read(t).num_rows for t in counts}
    assert counts["sentences"] == "30" and f"| variants | {ABSENT} |" in md
    views = {r[0] for r in Run(run["dir"], views=("sentences", "candidates", "pairs")).rows(
        "SELECT view_name FROM duckdb_views() WHERE NOT internal")}
    assert views == {"sentences", "candidates", "pairs"}


def test_the_mines_headline_does_not_load_the_plotting_library():
    """Every mine ends with `headline`: it draws nothing, so it leaves matplotlib (~0.5 CPU-s to import) to the
    page that plots."""
    probe = ("import sys; from contramine.pipeline.report import headline; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_hand_edited_settings_and_timeline_records_are_left_out_not_a_traceback(tmp_path):
    """A manifest's `config` band as lists ([1, 2]) and timeline jobs with a string `began`, or none: the report is
    written without them (was a TypeError in matplotlib's axvspan, and in the timeline's min())."""
    run = tmp_path / "edited"
    _write(run, "sentences", [{"sid": 0, "text": "a b c d", "n_words": 4, "line_no": 0}], "sentences", 0.1)
    _write(run, "neighbours", [{"sid": 0, "cand_sid": 0, "cos": 0.5, "rank": 0}], "neighbours", 0.1,
           {"neighbours": {"lo": [1, 2], "hi": [1, 2]}})
    man = run / "sentences" / "_manifest.json"
    record = json.loads(man.read_text())
    record["timeline"] = {"jobs": [{"job": 0, "began": "x", "ended": 1.0}, {"job": 1, "ended": 2.0},
                                   {"job": 2, "began": 1.0, "ended": 3.0, "worker": "w"}]}
    man.write_text(json.dumps(record))
    md = write_report(run).read_text()
    assert "negative band" not in md and (run / "report" / "index.md").is_file()
    from contramine.pipeline.report.timeline import run_timeline
    assert [(s.job, s.ended - s.began) for s in run_timeline(run).spans] == [(2, 2.0)]
    record["timeline"] = {"jobs": 5}  # not a list
    man.write_text(json.dumps(record))
    assert run_timeline(run).spans == [] and write_report(run).is_file()
