"""The `pairs` table against a direct computation: each anchor's chosen positives and negatives in draw order."""
from __future__ import annotations

import random

import pyarrow as pa

from contramine.pipeline.stages.pairs import build_pairs


def candidates_table(rng: random.Random, sids: list[int]) -> list[dict]:
    """Pools of 0-6 candidates per anchor and kind (some anchors have none, some sids are no anchor), shuffled, each
    candidate chosen or not, picks numbered in draw order among the chosen."""
    rows = []
    for sid in sids + [max(sids) + 1]:
        for kind in ("pos", "neg"):
            pool = rng.randint(0, 6)
            chosen = sorted(rng.sample(range(pool), rng.randint(0, pool)))
            picks = rng.sample(range(len(chosen)), len(chosen))
            for j in range(pool):
                pick = picks[chosen.index(j)] if j in chosen else -1
                rows.append({"sid": sid, "kind": kind, "pick": pick, "text": f"{kind}-{sid}-{j}", "chosen": j in chosen})
    rng.shuffle(rows)
    return rows


def test_pairs_lists_each_anchors_chosen_candidates_in_draw_order_whatever_the_kind_column():
    rng = random.Random(5)
    sids = rng.sample(range(100), 40)
    rows = candidates_table(rng, sids)
    want = {s: {k: [r["text"] for r in sorted((r for r in rows if r["sid"] == s and r["kind"] == k and r["chosen"]),
                                              key=lambda r: r["pick"])] for k in ("pos", "neg")} for s in sids}
    sentences = pa.table({"sid": pa.array(sids, pa.int64()), "text": [f"anchor {s}" for s in sids]})
    columns = {k: [r[k] for r in rows] for k in ("sid", "kind", "pick", "text", "chosen")}
    plain = pa.table({**columns, "pick": pa.array(columns["pick"], pa.int32())})
    half = len(rows) // 2  # the stage reads `kind` as a dictionary column: chunks with dictionaries of their own

    def encoded(kinds: list[str], dictionary: list[str]) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(pa.array([dictionary.index(k) for k in kinds], pa.int32()),
                                              pa.array(dictionary))

    kind = pa.chunked_array([encoded(columns["kind"][:half], ["pos", "neg"]),
                             encoded(columns["kind"][half:], ["neg", "pos"])])
    for candidates in (plain, plain.set_column(1, "kind", kind)):
        got = build_pairs(sentences, candidates)
        assert got.column("sid").to_pylist() == sids and got.column("anchor").to_pylist() == [f"anchor {s}" for s in sids]
        assert got.column("positives").to_pylist() == [want[s]["pos"] for s in sids]
        assert got.column("negatives").to_pylist() == [want[s]["neg"] for s in sids]
