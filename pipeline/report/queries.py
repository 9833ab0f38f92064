"""The numbers behind the mining report: the run's tables as DuckDB views, and the seeded samples and aggregates the
report's sections plot. Pure reads: nothing here writes."""
from __future__ import annotations

import math

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from contramine.pipeline.storage.tables import RunTables
from contramine.pipeline.schema import SCHEMAS
from contramine.pipeline.text_distances import lexical_overlap

ABSENT = "not produced in this run"  # how the page names a table the run did not write (Run.present[t] False)
RANDOM_PAIRS = 20_000
TEXT_SAMPLE = 200_000  # pairs whose overlap / MER is computed; beyond this a seeded sample


class Run:
    """The run's tables as DuckDB views (absent ones are not) plus their manifests, read through RunTables. `views`:
    only those tables become views (each view checks every file of its table first); the others are still `present`
    or not, from their manifests."""

    def __init__(self, run_dir: Path, views: tuple[str, ...] | None = None):
        self.dir, self.con, self.tables = run_dir, duckdb.connect(), RunTables(run_dir)
        self.manifests = {name: m for name in SCHEMAS if (m := self.tables.manifest(name))}
        self.present: dict[str, bool] = {}
        for name in SCHEMAS:
            # a listed table is served whole and checked, from the descriptors checked, which this connection
            # holds (RunTables.sql_source), or the report stops in its one line
            listed = name in self.manifests and self.tables.shards(name) > 0
            self.present[name] = listed or name in self.manifests
            if views is not None and name not in views:
                continue
            if listed:
                self.con.execute(f'CREATE TEMP VIEW "{name}" AS SELECT * FROM {self.tables.sql_source(name, self.con)}')
            elif self.present[name]:  # a stage that wrote a manifest but zero rows: an empty table, not absent
                self.con.register(name, SCHEMAS[name].empty_table())

    def rows(self, q: str) -> list[tuple]:
        return self.con.sql(q).fetchall()

    def count(self, name: str) -> int:
        return self.rows(f"SELECT count(*) FROM {name}")[0][0] if self.present[name] else 0

    def committed_rows(self, name: str) -> int:
        """The table's rows as its stage committed them (its manifest's count, else its file entries'): no file
        is opened. 0 for an absent table."""
        if name not in self.manifests:
            return 0
        n = (self.manifests[name].get("rows") or {}).get(name)
        return n if isinstance(n, int) else self.tables.committed_rows(name)

    def cfg(self, key: str, prefer: tuple[str, ...] = ()):
        """A config value from the manifests, looking in the `prefer` tables first; nested or dotted keys."""
        order = [t for t in prefer if t in self.manifests] + [t for t in self.manifests if t not in prefer]
        for t in order:
            hit = _find(self.manifests[t].get("config", {}), key)
            if hit is not None:
                return hit
        return None


    def number(self, key: str, prefer: tuple[str, ...] = ()) -> float | None:
        """`cfg`, where it is a finite number (a hand-edited manifest's list or string there is not drawn)."""
        v = self.cfg(key, prefer)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _find(tree, key: str):
    if not isinstance(tree, dict):
        return None
    for k, v in tree.items():
        if k == key or k.endswith("." + key):
            return v
    for v in tree.values():
        hit = _find(v, key)
        if hit is not None:
            return hit
    return None


def _sample_clause(seed: int, cols: str, n: int) -> str:
    # ORDER BY a seeded hash + LIMIT is a deterministic sample DuckDB answers with a top-N heap, not a full sort
    return f"ORDER BY hash({cols}, {seed}) LIMIT {n}"


def random_pair_cosines(run: Run, seed: int, n_pairs: int = RANDOM_PAIRS) -> np.ndarray:
    """Cosines of a seeded sample of distinct sentence pairs: the background the mined pairs are judged against."""
    if not run.present["embeddings"]:
        return np.zeros(0)
    sids = np.array([r[0] for r in run.rows("SELECT sid FROM embeddings ORDER BY sid")], dtype=np.int64)
    n = len(sids)
    k = min(n_pairs, n * (n - 1) // 2)
    if k <= 0:
        return np.zeros(0)
    rng = np.random.default_rng(seed)
    i = rng.integers(n, size=k)
    j = rng.integers(n - 1, size=k)
    j += j >= i  # never a sentence with itself
    need = pa.table({"sid": np.unique(np.concatenate([sids[i], sids[j]]))})
    run.con.register("_need", need)
    got = run.con.sql("SELECT e.sid, e.emb FROM embeddings e JOIN _need USING (sid) ORDER BY e.sid").to_arrow_table()
    emb = np.asarray(got.column("emb").combine_chunks().flatten(), dtype=np.float32).reshape(got.num_rows, -1)
    emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)  # stored vectors are unit; be safe anyway
    pos = np.searchsorted(got.column("sid").to_numpy(), sids)
    return np.einsum("kd,kd->k", emb[pos[i]], emb[pos[j]])  # type: ignore[index]  # pos: an array, as sids


def chosen_cos(run: Run, kind: str) -> np.ndarray:
    if not run.present["candidates"]:
        return np.zeros(0)
    q = f"SELECT cos FROM candidates WHERE chosen AND kind = '{kind}' AND cos IS NOT NULL"
    return np.array([r[0] for r in run.rows(q)], dtype=np.float64)


def chosen_text_pairs(run: Run, kind: str, seed: int, limit: int = TEXT_SAMPLE) -> tuple[pa.Array, pa.Array, int]:
    """(anchors, chosen texts, total) for one kind: from `pairs` (the training data) or else chosen candidates. The
    texts are Arrow string columns (no Python string per row: `lexical_overlap` reads them as they are)."""
    if run.present["pairs"]:
        col = "positives" if kind == "pos" else "negatives"
        base = f"SELECT sid, anchor a, unnest({col}) b FROM pairs"
    elif run.present["candidates"] and run.present["sentences"]:
        base = (f"SELECT c.sid, s.text a, coalesce(c.text, s2.text) b FROM candidates c JOIN sentences s ON s.sid = c.sid "
                f"LEFT JOIN sentences s2 ON s2.sid = c.cand_sid WHERE c.chosen AND c.kind = '{kind}'")
    else:
        return pa.array([], pa.string()), pa.array([], pa.string()), 0
    total = run.rows(f"SELECT count(*) FROM ({base}) WHERE b IS NOT NULL")[0][0]
    got = run.con.sql(f"SELECT a, b FROM ({base}) WHERE b IS NOT NULL "
                      f"{_sample_clause(seed, 'sid, a, b', limit)}").to_arrow_table()
    return got.column("a").combine_chunks(), got.column("b").combine_chunks(), total


def overlap_stats(run: Run, seed: int = 0) -> dict[str, tuple[float | None, int, int]]:
    """kind -> (mean lexical overlap with the anchor, pairs measured, pairs in the run). DebCSE Table 4's measure:
    contramine.pipeline.text_distances.lexical_overlap (multiset word intersection / words of the longer sentence)."""
    out = {}
    for kind in ("pos", "neg"):
        a, b, total = chosen_text_pairs(run, kind, seed)
        out[kind] = (float(lexical_overlap(a, b).mean()) if len(a) else None, len(a), total)
    return out


def overlap_by_source(run: Run, seed: int = 0, limit: int = TEXT_SAMPLE) -> list[dict]:
    """Per (kind, source): the whole candidate pool and the chosen ones — candidates, mean cosine, mean lexical
    overlap (a seeded sample of at most `limit` per row). Says whether IPW moved Table 4's numbers, or the pools
    set them."""
    if not (run.present["candidates"] and run.present["sentences"]):
        return []
    out = []
    groups = run.rows("SELECT kind, source, count(*), avg(cos), sum(chosen::INT), avg(CASE WHEN chosen THEN cos END) "
                      "FROM candidates GROUP BY kind, source ORDER BY kind DESC, source")
    for kind, source, n, cos, n_chosen, cos_chosen in groups:
        row = {"kind": kind, "source": source, "pool": n, "pool_cos": cos, "chosen": n_chosen, "chosen_cos": cos_chosen}
        for which, where in (("pool", ""), ("chosen", "AND c.chosen")):
            got = run.con.sql(
                f"SELECT s.text a, coalesce(c.text, s2.text) b FROM candidates c JOIN sentences s ON s.sid = c.sid "
                f"LEFT JOIN sentences s2 ON s2.sid = c.cand_sid WHERE c.kind = $kind AND c.source = $source {where} "
                f"{_sample_clause(seed, 'c.sid, c.text, c.cand_sid', limit)}",
                params={"kind": kind, "source": source}).to_arrow_table()
            a, b = got.column("a").combine_chunks(), got.column("b").combine_chunks()
            row[f"{which}_overlap"] = float(lexical_overlap(a, b).mean()) if len(a) else None
        out.append(row)
    return out


def pool_peakedness(run: Run) -> pa.Table:
    """Per (sid, kind) pool: n, max p / (1/n) and H(p) / log n (1.0 for a one-candidate pool: trivially uniform)."""
    return run.con.sql("""
        WITH q AS (SELECT sid, kind, p / sum(p) OVER (PARTITION BY sid, kind) AS p, count(*) OVER (PARTITION BY sid, kind) AS n
                   FROM candidates WHERE p IS NOT NULL)
        SELECT sid, kind, any_value(n) AS n, max(p) * any_value(n) AS times_uniform,
               CASE WHEN any_value(n) > 1 THEN -sum(CASE WHEN p > 0 THEN p * ln(p) ELSE 0 END) / ln(any_value(n))
                    ELSE 1.0 END AS entropy_ratio
        FROM q GROUP BY sid, kind ORDER BY kind, sid""").to_arrow_table()


def _rejected_weight(run: Run) -> str:
    # a rejected row stands for `lines` records (a record's repeats, pipeline/corpus/filter.py); a run mined
    # before that column existed has one record a row
    if run.rows("SELECT count(*) FROM information_schema.columns WHERE "
                "table_name = 'rejected' AND column_name = 'lines'")[0][0]:
        return "coalesce(lines, 1)"
    return "1"


def rejected_lines(run: Run) -> int:
    """Corpus lines the sentence filter dropped (0 when the run has no `rejected` table)."""
    if not run.present["rejected"]:
        return 0
    return run.rows(f"SELECT sum({_rejected_weight(run)}) FROM rejected")[0][0] or 0


def rejected_by_reason(run: Run) -> list[tuple]:
    """(reason, corpus lines) pairs, most lines first."""
    return run.rows(f"SELECT reason, sum({_rejected_weight(run)}) n FROM rejected "
                    "GROUP BY reason ORDER BY n DESC, reason")


def backtranslation_flags(run: Run) -> list[tuple]:
    """(degenerate flag or 'fine (used)', outputs) pairs, the fine ones first."""
    return run.rows("SELECT coalesce(flag, 'fine (used)') f, count(*) n FROM backtranslations "
                    "GROUP BY flag ORDER BY flag NULLS FIRST")


def candidate_sample(run: Run, kind: str, seed: int, limit: int) -> list[tuple]:
    """(anchor text, candidate text, cos, chosen) of a seeded sample of one kind's candidates that have both."""
    return run.rows(
        f"SELECT s.text, coalesce(c.text, s2.text), c.cos, c.chosen FROM candidates c JOIN sentences s ON s.sid = c.sid "
        f"LEFT JOIN sentences s2 ON s2.sid = c.cand_sid WHERE c.kind = '{kind}' AND c.cos IS NOT NULL "
        f"AND coalesce(c.text, s2.text) IS NOT NULL {_sample_clause(seed, 'c.sid, c.cand_sid, c.text', limit)}")


def negation_outcomes(run: Run) -> list[tuple]:
    """(rule applied, why not negated, sentences), the most common outcome first."""
    return run.rows("SELECT coalesce(rule, '—'), coalesce(reason, '—'), count(*) n FROM negations "
                    "GROUP BY ALL ORDER BY n DESC")


def triplet_sample(run: Run, seed: int, limit: int = TEXT_SAMPLE) -> list[tuple]:
    """(anchor, paraphrase, negation, para_mer) of a seeded sample of the triplets."""
    return run.rows(f"SELECT anchor, paraphrase, negation, para_mer FROM triplets {_sample_clause(seed, 'sid', limit)}")


def chosen_examples(run: Run, seed: int, anchors: int) -> list[tuple]:
    """(sid, anchor, kind, text, p) of every chosen candidate of a seeded sample of anchors, by anchor, positives
    first, most likely first."""
    return run.rows(f"""
            WITH a AS (SELECT DISTINCT sid FROM candidates WHERE chosen), pick AS (SELECT sid FROM a {_sample_clause(seed, 'sid', anchors)})
            SELECT c.sid, s.text, c.kind, coalesce(c.text, s2.text), c.p FROM candidates c JOIN pick USING (sid)
            JOIN sentences s ON s.sid = c.sid LEFT JOIN sentences s2 ON s2.sid = c.cand_sid
            WHERE c.chosen ORDER BY c.sid, c.kind DESC, c.p DESC""")


def triplet_examples(run: Run, seed: int, limit: int) -> list[tuple]:
    """(sid, anchor, paraphrase, negation, para_mer) of a seeded sample of the triplets."""
    return run.rows(f"SELECT sid, anchor, paraphrase, negation, para_mer FROM triplets "
                    f"{_sample_clause(seed, 'sid', limit)}")
