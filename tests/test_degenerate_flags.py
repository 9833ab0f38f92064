"""The degenerate check over whole columns (`degenerate_flags`) and the backtranslate shard built from it give what
the row rule (`degenerate_flag`) and a row-by-row table give: the flag of every output is unchanged."""
from __future__ import annotations

import random
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from contramine.pipeline.config import configure
from contramine.pipeline.degenerate import _EDGE, LOWER_UNLIKE_PYTHON, MAX_N, degenerate_flag, degenerate_flags
from contramine.pipeline.memo.rows import row_key
from contramine.pipeline.models.translate.chains import chains_plan, load_chains, translate_rows
from contramine.pipeline.schema import SCHEMAS
from contramine.pipeline.stages.backtranslate import backtranslate_shard, row_keys, row_suffixes

ODD = ["İ", "Σ", "ς", "σ", "\ua7cb", "\U00010d50", "é", "ß", "ﬃ", "\u00a0", "\u2028", "\u3000", "\x1c", "\x1f", "\x85",
       "“", "”", "…", "—", "«"]
WORDS = ["the", "The", "THE", "of", "state", "State.", "(state)", "title", "...", "-", "«a»", "Σ", "ΟΔΟΣ", "οδος",
         "İstanbul", "i̇stanbul", "x", "a"]


def hostile_text(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.5:
        seps = [" ", " ", " ", "  ", "\t", "\n", "\x0b", "\x1c", "\u2028", "\u3000"]
        return "".join(rng.choice(WORDS) + rng.choice(seps) for _ in range(rng.randint(0, 16))).strip(" ") \
            if rng.random() < 0.5 else "".join(rng.choice(WORDS) + rng.choice(seps) for _ in range(rng.randint(0, 16)))
    if kind < 0.8:
        alphabet = list("abAB .,!?'()-\t\n") + ODD
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
    return rng.choice(["", " ", "a a", "A a.", "a  a", "x y x y", "x y z x y z", "...", ". .", "Σ σ", "İ i̇",
                       "one two three four five six seven", "one one two three four five six seven eight"])


@pytest.mark.parametrize("ratios", [(1.5, 0.5, 6), (1.2, 0.8, 2), (2.0, 0.1, 0)])
def test_flags_of_whole_columns_equal_the_row_rule(ratios):
    rng = random.Random(sum(ratios))
    sources = [hostile_text(rng) for _ in range(6000)]
    outputs = [hostile_text(rng) if rng.random() < 0.7 else rng.choice(sources) + " " + rng.choice(WORDS)
               for _ in range(6000)]
    want = [degenerate_flag(s, o, *ratios) for s, o in zip(sources, outputs)]
    chunked = pa.chunked_array([pa.array(outputs[:1000]), pa.array(outputs[1000:])])
    assert degenerate_flags(pa.array(sources), chunked, *ratios).to_pylist() == want
    assert {"repeats", "too_long", "too_short", None} <= set(want)  # every rule fired


def test_small_columns_of_every_word_count_equal_the_row_rule():
    """A shard whose rows hold few words in all (a short corpus: `make mine` of 8 lines): every total from 0 to
    3 * MAX_N + 2 words, in one row and split over rows, repeating or not, plain ASCII and not (6 words in all
    once raised a NumPy broadcast error)."""
    rng = random.Random(7)
    for total in range(0, 3 * MAX_N + 3):
        for vocab in (["a", "b"], ["one", "two", "three", "four", "five", "six", "seven"], ["Σ", "σ", "x"]):
            words = [rng.choice(vocab) for _ in range(total)]
            cuts = sorted(rng.sample(range(total + 1), min(total + 1, rng.randint(0, 3))))
            outputs = [" ".join(words[i:j]) for i, j in zip([0, *cuts], [*cuts, total])]
            sources = [rng.choice(["a b c d e f", "one two", ""]) for _ in outputs]
            want = [degenerate_flag(src, out) for src, out in zip(sources, outputs)]
            assert degenerate_flags(pa.array(sources), pa.array(outputs)).to_pylist() == want, (total, outputs)


def test_arrow_splits_trims_and_lowers_each_code_point_as_python_or_the_code_point_is_listed():
    """What the column check relies on, for every code point of this Python and this pyarrow: Arrow splits at the
    code points `str.split` splits at, trims what `str.strip` strips, and a code point that Arrow lowers otherwise
    than `str.lower` (alone, or after a cased letter: the final sigma) is in LOWER_UNLIKE_PYTHON, whose rows take
    the row rule."""
    code_points = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    parts = pc.list_value_length(pc.utf8_split_whitespace(pa.array(["a" + c + "b" for c in code_points])))
    assert parts.to_pylist() == [2 if c.isspace() else 1 for c in code_points]
    trimmed = pc.utf8_trim(pa.array(code_points), characters=_EDGE)
    assert pc.equal(trimmed, "").to_pylist() == [c in _EDGE for c in code_points]
    listed = pc.match_substring_regex(pa.array(code_points), f"[{LOWER_UNLIKE_PYTHON}]").to_numpy(zero_copy_only=False)
    for context in ("{}", "X{}"):
        texts = [context.format(c) for c in code_points]
        same = pc.equal(pc.utf8_lower(pa.array(texts)), pa.array([t.lower() for t in texts])).to_numpy(zero_copy_only=False)
        unlike = [hex(ord(code_points[i])) for i in (~same & ~listed).nonzero()[0]]
        assert not unlike, unlike


def test_the_shard_equals_its_table_built_row_by_row(tmp_path):
    """backtranslate_shard (column by column, memo keys from one hashed prefix) against the same table built as
    the stage built it before: a row per (input, return) in input order, sorted by (sid, chain, variant), each
    flag from `degenerate_flag`, each key from `row_key`."""
    sets = ['backtranslate.chains=[{models=["standin:shuffle-zh", "standin:shuffle-en"], role="positives"}, '
            '{models=["standin:shuffle-de", "standin:shuffle-en"], role="paraphrases", include_variants=true}]',
            "backtranslate.fallback=false", "backtranslate.num_return_sequences=2", "backtranslate.num_beams=2", f"run.root={tmp_path}"]
    cfg = configure("default", "flags", None, sets)
    rng = random.Random(7)
    texts = [hostile_text(rng) for _ in range(300)]
    sentences = pa.table({"sid": pa.array(range(300), pa.int64()), "text": texts})
    variants = pa.table({"sid": pa.array([s for s in range(0, 300, 3) for _ in (1, 2)], pa.int64()),
                         "variant": pa.array([v for _ in range(0, 300, 3) for v in (1, 2)], pa.int32()),
                         "text": [hostile_text(rng) for _ in range(200)], "ops": ["swap"] * 200}
                        ).cast(SCHEMAS["variants"])
    plan = chains_plan(cfg)
    loaded = load_chains(cfg, plan=plan)
    got = backtranslate_shard(sentences, variants, cfg, plan, lambda: loaded)

    clean = [(s, 0, t) for s, t in zip(range(300), texts)]
    noised = list(zip(variants.column("sid").to_pylist(), variants.column("variant").to_pylist(),
                      variants.column("text").to_pylist()))
    bt, want = cfg.backtranslate, []
    for chain in bt.chains:
        rows = clean + [r for r in noised if chain.translates_variant(r[1])]
        pivots, outputs = translate_rows(rows, loaded[chain.name], cfg.run.seed)
        for (sid, variant, source), pivot, hyps in zip(rows, pivots, outputs):
            want += [{"sid": sid, "chain": chain.name, "variant": variant, "pivot_text": pivot, "text": text,
                      "model": " > ".join(chain.models), "role": chain.role,
                      "flag": degenerate_flag(source, text, bt.degenerate_max_ratio, bt.degenerate_min_ratio,
                                              bt.degenerate_min_words)} for text in hyps]
        columns = [pa.array(c, t) for c, t in zip(zip(*rows), (pa.int64(), pa.int32(), pa.string()))]
        assert row_keys(b"prefix", row_suffixes(*columns)) == [row_key(b"prefix", f"{s}/{v}", t) for s, v, t in rows]
    want.sort(key=lambda r: (r["sid"], r["chain"], r["variant"]))  # stable, as Arrow's sort
    assert got.schema.equals(SCHEMAS["backtranslations"])
    assert got.to_pylist() == want
    assert {"repeats", None} <= set(got.column("flag").to_pylist())
