"""What a user relies on: hostile corpora, kill -9 mid-run, determinism, damaged caches, clear config errors.

Every mining run here uses tiny corpora (at most 70 lines) and the small settings of test_mine_flow.py. Mining runs
in-process under `prefect_harness`; where a process must die or an exit code matters, the CLI runs in a subprocess
(`tests/hostile.py` = `python -m flows.cli` plus a pause hook), pointed at the harness' Prefect server so that it
starts no server of its own and a kill leaves no orphan behind.

Hostile inputs (S = succeeds, every line ends in `sentences` or `rejected`, |sentences| + |rejected| = lines;
E = exit code 2 and one line on stderr naming the key / path / stage, nothing written under the run dir):

| input                                                            | outcome                                       |
|------------------------------------------------------------------|-----------------------------------------------|
| UTF-8 BOM before the first line                                  | S: BOM dropped, line kept as written          |
| empty line; spaces/tabs only; NBSP/EM/ideographic spaces only    | S: rejected `empty`                           |
| control characters only (NUL, BEL, ESC, DEL)                     | S: rejected `empty`                           |
| control chars, form feed, vertical tab inside a sentence         | S: kept, each a space; no extra line          |
| NEL, U+2028, U+2029 inside a line                                | S: kept as one line (\\n \\r\\n \\r break)    |
| BOM (U+FEFF) inside a line                                       | S: kept, becomes a space                      |
| 50,000-character line (8,334 words; one 50,000-char word)        | S: `too_long`, full text kept in `rejected`   |
| 1,999 characters / 100 words; 128 words                          | S: kept (the encoder truncates)               |
| 129 words                                                        | S: rejected `too_long`                        |
| invalid UTF-8 (Latin-1 byte, cut sequence, surrogate, 0xFF)      | S: `undecodable`, text with U+FFFD            |
| mixed \\n, \\r\\n, \\r endings, no final newline                 | S: every line counted once                    |
| Arabic, Hebrew with direction marks, emoji, ZWJ sequences        | S: kept, embedded, mined                      |
| decomposed vs composed é; whitespace variant; exact copy         | S: `duplicate` (after NFC, whitespace)        |
| two words                                                        | S: rejected `too_short`                       |
| every line the same (12 lines, 6 with extra spaces)              | S: 1 sentence + 11 `duplicate`; shard 0       |
|                                                                  |    of 2 empty; no neighbours, noise positives |
| corpus of one sentence                                           | S: the `sentences` shards of the case above,  |
|                                                                  |    so the same keys and tables (checked)      |
| distinct lines, identical embeddings (encoder.max_length=4       | S: all pairs in band at hi = 1, ties ranked   |
|    reads each as [CLS] the cat [SEP]); 10 < pool_size = 12       |    by sid, 9 a pool = brute force; hi = 0.75: |
|                                                                  |    no neighbour at all                        |
| empty file (0 bytes)                                             | S: every table empty, corpus_lines = 0        |
| only blank lines                                                 | S: 5 `empty`; the same empty `sentences`      |
| missing corpus file (and folder); corpus path is a folder        | E: names the path                             |
| .parquet corpus: no `text`; `text` int64; not Parquet at all     | E: names the path and what is wrong           |
| UTF-16 text file (with its byte order mark)                      | E: names the path, says convert to UTF-8      |
| unknown key or section, wrong type, lo > hi, m_neg > pool_size,  | E: names the key                              |
|    temperature <= 0, other out-of-range values, dask without     |                                               |
|    address, bad run name, override without `=`, no such profile  |                                               |
| encoder.model=/nonexistent/path, a hub id with HF_HUB_OFFLINE=1, | E: names the model                            |
|    a folder without config.json, spaCy pipeline not installed,   |                                               |
|    translation model missing (fallback = false)                  |                                               |
| `stage neighbours` / `stage embeddings` on a fresh run;          | E: names the stage to run first               |
|    `stage scores` without neighbours                             |                                               |
| `stage neighbours` with run.shards unlike its input's            | E: names both shard counts                    |
| `stage neighbours` after an embeddings shard was truncated and   | E: names table, shards and the stage that     |
|    another deleted                                               |    repairs them; running it does (same bytes) |

Faults (one mining run killed with SIGKILL at each point, the next run resumes; the last run completes):

| kill point                                                      | after the rerun                              |
|-----------------------------------------------------------------|----------------------------------------------|
| embeddings, shard 1 computing (shard 0 written)                 | shard 0 reused (untouched), shard 1 computed |
| neighbours, shard 1 in its temp file, not yet renamed           | temp file removed, shard 0 reused            |
| a moment the test does not choose, after negate's first shard   | every shard intact at the kill reused        |
| ipw, candidates shard 0 renamed into place, sidecar not written | shard recomputed (no sidecar, no trust)      |
| completion (in-process)                                         | every table equals an uninterrupted run      |

Damaged caches between runs (each recomputed, never reused; the tables equal a clean run; the recomputed shard has
the same bytes, so nothing downstream is recomputed): truncated Parquet shard, deleted shard whose sidecar survived,
deleted sidecar, truncated (invalid JSON) sidecar, one flipped byte with size and mtime kept, a leftover temp file
and a shard of another layout; a corpus changed in place with the same name, size and mtime (sentences and what
depends on them recomputed; equals a clean run of the new corpus).

Determinism: the reference run (2 shards, 1 worker) equals 1 shard / 1 worker and 7 shards / 4 threads
(test_mine_flow.py covers 1 vs 2 shards and 7 shards / 2 workers on another corpus).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from flows.cli import main as cli_main
from flows.mine import configure, mine_flow
from pipeline.config import NeighboursCfg
from pipeline.embeddings import table_vectors
from pipeline.neighbours import band_neighbours, build_index, exact_band_neighbours
from pipeline.sentences import CorpusError, split_sentences
from pipeline.stages import ORDER, STAGES
from pipeline.store import Store, file_hash

from hostile import KEPT, hostile_rows, plain_rows, wiki_lines, write_corpus

pytestmark = pytest.mark.usefixtures("prefect_harness")

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["encoder.max_length=32", "neighbours.pool_size=8", "noise.n_variants=2", "run.shards=2",
         "backtranslate.chains=[]"]
TABLES = [t for s in ORDER for t in STAGES[s].outputs]


def _mine(corpus: Path, root: Path, name: str, *extra: str):
    sets = SMALL + [f"run.root={root}", *extra]
    mine_flow(profile="default", run=name, corpus=str(corpus), overrides=sets)
    return configure("default", name, str(corpus), sets)


def _tables(run_dir: Path) -> dict[str, pa.Table]:
    store = Store(run_dir)
    return {t: store.read(t) for t in TABLES}


def _assert_same_tables(got: dict, want: dict, what: str) -> None:
    for table, data in want.items():
        assert got[table].equals(data), f"table {table} differs: {what}"


def _manifest(run_dir: Path, table: str) -> dict:
    return Store(run_dir).manifest(table)


def _counts(run_dir: Path) -> dict[str, tuple[int, int]]:
    """(shards_computed, shards_cached) of every stage's last run."""
    return {s: (m["shards_computed"], m["shards_cached"]) for s in ORDER
            if (m := _manifest(run_dir, STAGES[s].outputs[0]))}


def _intact_shards(run_dir: Path) -> dict[Path, tuple[int, int, str]]:
    """Shards whose Parquet bytes match their sidecar: {sidecar: (sidecar mtime, parquet mtime, hash)}."""
    out = {}
    for side in run_dir.glob("*/part-*.json"):
        part = side.with_suffix(".parquet")
        meta = json.loads(side.read_text())
        if part.is_file() and file_hash(part) == meta["hash"]:
            out[side] = (side.stat().st_mtime_ns, part.stat().st_mtime_ns, meta["hash"])
    return out


def _assert_untouched(snapshot: dict[Path, tuple[int, int, str]], what: str) -> None:
    for side, (side_mtime, part_mtime, h) in snapshot.items():
        part = side.with_suffix(".parquet")
        assert side.stat().st_mtime_ns == side_mtime and part.stat().st_mtime_ns == part_mtime, \
            f"{side.parent.name}/{part.name} was finished before the kill but rewritten by {what}"
        assert file_hash(part) == h


def _assert_all_intact(run_dir: Path) -> None:
    assert not list(run_dir.glob("*/.part-*.tmp")), "temp files of a killed writer left behind"
    for table in TABLES:
        n = _manifest(run_dir, table)["shards"]
        for i in range(n):
            part = Store(run_dir).shard_path(table, i, n)
            assert file_hash(part) == json.loads(part.with_suffix(".json").read_text())["hash"]


# ---------------------------------------------------------------- the reference run: the hostile corpus

@pytest.fixture(scope="module")
def rows():
    return hostile_rows()


@pytest.fixture(scope="module")
def corpus(rows, tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("hostile") / "hostile.txt", rows)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """An uninterrupted run on the hostile corpus: 2 shards, 1 worker."""
    cfg = _mine(corpus, tmp_path_factory.mktemp("ref"), "ref")
    return cfg.run.dir, _tables(cfg.run.dir)


def test_hostile_lines_each_end_where_expected(reference, rows, corpus):
    run_dir, t = reference
    sentences, rejected = t["sentences"], t["rejected"]
    assert sentences.num_rows + rejected.num_rows == len(rows) == 70
    assert _manifest(run_dir, "sentences")["corpus_lines"] == len(rows)
    want = {no: reason for no, (_, _, reason) in enumerate(rows, start=1) if reason is not KEPT}
    got = dict(zip(rejected.column("line_no").to_pylist(), rejected.column("reason").to_pylist()))
    assert got == want
    assert sorted(sentences.column("line_no").to_pylist()) == [no for no, r in enumerate(rows, 1) if r[2] is KEPT]
    texts = dict(zip(sentences.column("line_no").to_pylist(), sentences.column("text").to_pylist()))
    assert texts[1] == wiki_lines(1)[0]  # the BOM is gone
    bad = [c for s in texts.values() for c in s if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c in "\ufeff\u2028\u2029"]
    assert bad == []
    kept_by_content = {rows[no - 1][0]: s for no, s in texts.items()}
    assert kept_by_content[b"The\x00quick\tbrown\x1bfox jumps\x7f over the lazy dog"] == \
        "The quick brown fox jumps over the lazy dog"
    assert kept_by_content["next line\u0085and line\u2028and paragraph\u2029separators".encode()] == \
        "next line and line and paragraph separators"
    assert kept_by_content["Cafe\u0301 is open today".encode()] == "Café is open today"
    rej_text = dict(zip(rejected.column("line_no").to_pylist(), rejected.column("text").to_pylist()))
    for no, reason in want.items():
        raw = rows[no - 1][0]
        if reason == "undecodable":
            assert rej_text[no] == raw.decode("utf-8", errors="replace") and "\ufffd" in rej_text[no]
        else:
            assert rej_text[no] == raw.decode("utf-8")  # lossless, the 50,000 characters included
    assert max(len(s) for s in rej_text.values()) == 50_000
    # RTL text, emoji and the 1,999-character line went all the way through
    marks = ["القطة", "החתול", "😀 🎉 🚀", "👨\u200d👩\u200d👧", "w" * 17 + "99"]
    exotic = {sid for sid, s in zip(sentences.column("sid").to_pylist(), sentences.column("text").to_pylist())
              if any(m in s for m in marks)}
    assert len(exotic) == len(marks)
    for table in ("embeddings", "pairs", "negations"):
        assert exotic <= set(t[table].column("sid").to_pylist()), table
    sids, vecs = table_vectors(t["embeddings"])
    assert np.isfinite(vecs).all() and np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-5)
    assert t["pairs"].num_rows == sentences.num_rows
    assert t["neighbours"].num_rows > 0 and t["neighbours"].equals(_brute_force(t, 0.25, 0.75, 8))


# ---------------------------------------------------------------- degenerate corpora, each mined end to end

def _degenerate(tmp_path, name, rows, *extra):
    corpus = write_corpus(tmp_path / f"{name}.txt", rows)
    cfg = _mine(corpus, tmp_path / "runs", name, *extra)
    t = _tables(cfg.run.dir)
    assert t["sentences"].num_rows + t["rejected"].num_rows == len(rows)
    assert t["pairs"].num_rows == t["embeddings"].num_rows == t["negations"].num_rows == t["sentences"].num_rows
    return cfg, t


def _brute_force(t, lo, hi, pool):
    sids, x = table_vectors(t["embeddings"])
    return exact_band_neighbours(x, sids, x, sids, lo, hi, pool)


def test_every_line_the_same_is_a_one_sentence_corpus(tmp_path):
    """12 copies of one line (6 with extra spaces): one sentence, 11 duplicates; shard 0 of 2 is empty. A corpus
    of that one line alone gives the very same `sentences` shards (checked here), hence the same cache keys and
    the same tables downstream: this run is the one-sentence corpus's run too."""
    line = wiki_lines(1, skip=1)[0]
    cfg, t = _degenerate(tmp_path, "same", plain_rows([line] * 6 + ["  " + line] * 6))
    assert t["sentences"].column("text").to_pylist() == [line]
    assert t["sentences"].column("line_no").to_pylist() == [1]
    assert t["rejected"].column("reason").to_pylist() == ["duplicate"] * 11
    store = Store(cfg.run.dir)
    assert store.read_shard("sentences", 0, 2).num_rows == 0  # an empty shard went through every stage
    assert t["neighbours"].num_rows == 0
    assert t["variants"].num_rows == 2
    pair = t["pairs"].to_pylist()[0]
    assert pair["negatives"] == [] and len(pair["positives"]) == 2
    one = write_corpus(tmp_path / "one.txt", plain_rows([line]))
    kept, rejected = split_sentences(one, cfg.sentences.min_words, cfg.sentences.max_words, cfg.sentences.max_chars)
    assert rejected.num_rows == 0 and kept.equals(t["sentences"])


def test_identical_embeddings_and_fewer_sentences_than_pool_size(tmp_path):
    """With encoder.max_length=4 a line is read as [CLS] the cat [SEP]: ten distinct lines, one vector, every
    cosine 0.99999994. With hi = 1 every pair is in band, the ties are ranked by sid, and 10 sentences are fewer
    than pool_size = 12: each pool holds the 9 others. With the default band (hi = 0.75) there is no neighbour."""
    words = "really quietly slowly happily never always often then later first".split()
    lines = [f"The cat {w} sat on a mat number {i}" for i, w in enumerate(words)]
    _, t = _degenerate(tmp_path, "same-vectors", plain_rows(lines), "encoder.max_length=4", "neighbours.hi=1.0",
                       "neighbours.pool_size=12")
    sids, x = table_vectors(t["embeddings"])
    assert len(sids) == 10 and (x == x[0]).all()
    nb = t["neighbours"]
    assert nb.equals(_brute_force(t, 0.25, 1.0, 12))
    assert nb.num_rows == 10 * 9
    for sid in sids.tolist():
        got = nb.filter(pc.equal(nb.column("sid"), sid)).column("cand_sid").to_pylist()
        assert got == sorted(s for s in sids.tolist() if s != sid)
    neg = t["candidates"].filter(pc.equal(t["candidates"].column("kind"), "neg"))
    assert np.isfinite(neg.column("p").to_numpy()).all()
    assert np.allclose(neg.column("s_sem").to_numpy(), 1 / 9)  # one cosine: S_sem is uniform, edit decides
    assert sum(neg.column("chosen").to_pylist()) == 10 * 2
    nc = NeighboursCfg(pool_size=12)
    index, cpu_index = build_index(x, "flat", nc)
    none = band_neighbours(x, sids, x, sids, index, cpu_index, nc.lo, nc.hi, nc.pool_size, nc.slack)
    assert none.num_rows == 0 and none.equals(exact_band_neighbours(x, sids, x, sids, nc.lo, nc.hi, 12))


def test_empty_corpus_file(tmp_path):
    """0 bytes: succeeds with every table empty. A file of blank lines gives the same (empty) `sentences`
    shards, so the same run downstream; checked at the sentences stage."""
    corpus = tmp_path / "empty.txt"
    corpus.write_bytes(b"")
    cfg = _mine(corpus, tmp_path / "runs", "empty")
    t = _tables(cfg.run.dir)
    assert all(t[tb].num_rows == 0 for tb in TABLES)
    assert _manifest(cfg.run.dir, "sentences")["corpus_lines"] == 0
    blank = tmp_path / "blank.txt"
    blank.write_bytes(b"\n \n\t\n\r\n\r")
    kept, rejected = split_sentences(blank, 3, 128, 2000)
    assert kept.equals(t["sentences"]) and rejected.column("reason").to_pylist() == ["empty"] * 5


# ---------------------------------------------------------------- determinism

@pytest.mark.parametrize("name,extra", [("one-shard", ["run.shards=1"]),
                                        ("seven-shards-four-threads", ["run.shards=7", "runner.workers=4"])])
def test_same_tables_whatever_the_shards_and_workers(reference, corpus, tmp_path, name, extra):
    cfg = _mine(corpus, tmp_path, name, *extra)
    _assert_same_tables(_tables(cfg.run.dir), reference[1], f"with {extra}")


# ---------------------------------------------------------------- kill -9 and resume

def _cli_env(**extra) -> dict:
    import prefect.settings

    env = {**os.environ, "PREFECT_API_URL": prefect.settings.PREFECT_API_URL.value(), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.update(extra)
    return env


def _killed_mine(corpus: Path, root: Path, tmp: Path, *, pause_at: str | None = None,
                 kill_when: str | None = None, timeout: float = 300) -> None:
    """Start `mine` in a subprocess; SIGKILL it when it reaches `pause_at` (the hook) or when the file pattern
    `kill_when` appears under the run dir (a moment the test does not choose)."""
    marker = tmp / f"paused-{time.monotonic_ns()}"
    env = _cli_env(CONTRAMINE_PAUSE_AT=pause_at or "", CONTRAMINE_PAUSE_MARKER=str(marker))
    cmd = [sys.executable, str(ROOT / "tests" / "hostile.py"), "mine", "--corpus", str(corpus), "--run", "faulty",
           "--set", *SMALL, f"run.root={root}"]
    log = tmp / f"{(pause_at or kill_when).replace(':', '_').replace('/', '_').replace('*', '')}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if (pause_at and marker.exists()) or (kill_when and any((root / "faulty").glob(kill_when))):
                    break
                assert proc.poll() is None, f"mine exited ({proc.returncode}) before the kill point:\n" + \
                    log.read_text(errors="replace")[-3000:]
                assert time.monotonic() < deadline, f"kill point {pause_at or kill_when} not reached in {timeout}s"
                time.sleep(0.02)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_kill_9_anywhere_then_resume(reference, corpus, tmp_path):
    root, run_dir = tmp_path / "runs", tmp_path / "runs" / "faulty"
    emb0 = run_dir / "embeddings" / "part-00000-of-00002.json"

    _killed_mine(corpus, root, tmp_path, pause_at="compute:embeddings:1")
    assert _manifest(run_dir, "sentences") is not None and not (run_dir / "embeddings" / "_manifest.json").exists()
    assert emb0.is_file() and not emb0.with_name("part-00001-of-00002.parquet").exists()
    snap1 = _intact_shards(run_dir)
    assert emb0 in snap1

    _killed_mine(corpus, root, tmp_path, pause_at="tmp:neighbours:1")
    _assert_untouched(snap1, "the run after the kill during embeddings")
    assert _counts(run_dir)["embeddings"] == (1, 1) and _counts(run_dir)["sentences"] == (0, 2)
    assert len(list((run_dir / "neighbours").glob(".part-00001-of-00002.parquet.*.tmp"))) == 1
    assert not (run_dir / "neighbours" / "part-00001-of-00002.parquet").exists()
    snap2 = _intact_shards(run_dir)

    _killed_mine(corpus, root, tmp_path, kill_when="negations/part-00000-of-00002.json")
    _assert_untouched(snap2, "the run after the kill during a neighbours shard write")
    assert _counts(run_dir)["neighbours"] == (1, 1)
    assert not list((run_dir / "neighbours").glob("*.tmp"))
    snap3 = _intact_shards(run_dir)
    negate_done = sum(1 for s in snap3 if s.parent.name == "negations")
    assert negate_done >= 1

    _killed_mine(corpus, root, tmp_path, pause_at="sidecar:candidates:0")
    _assert_untouched(snap3, "the run after a kill at a random point of negate")
    assert _counts(run_dir)["negate"] == (2 - negate_done, negate_done)
    assert (run_dir / "candidates" / "part-00000-of-00002.parquet").is_file()
    assert not (run_dir / "candidates" / "part-00000-of-00002.json").exists()
    snap4 = _intact_shards(run_dir)

    _mine(corpus, root, "faulty")
    for snap in (snap1, snap2, snap3, snap4):
        _assert_untouched(snap, "the completing run")
    counts = _counts(run_dir)
    assert counts["scores"] == (0, 2) and counts["ipw"] == (2, 0)
    _assert_all_intact(run_dir)
    _assert_same_tables(_tables(run_dir), reference[1], "after four kill -9 and a resume")


# ---------------------------------------------------------------- damaged caches between runs

def test_damaged_shards_are_recomputed_never_reused(reference, corpus, tmp_path):
    ref_dir, want = reference
    run_dir = tmp_path / "ref"
    shutil.copytree(ref_dir, run_dir)
    part = lambda table, i: run_dir / table / f"part-{i:05d}-of-00002.parquet"  # noqa: E731

    p = part("embeddings", 0)                                   # truncated Parquet shard
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    part("neighbours", 1).unlink()                              # shard deleted, its sidecar survived
    part("scores", 0).with_suffix(".json").unlink()             # sidecar deleted
    side = part("candidates", 1).with_suffix(".json")           # sidecar cut short: invalid JSON
    side.write_text(side.read_text()[:20])
    p = part("negations", 1)                                    # one byte flipped, same size and mtime
    st, data = p.stat(), bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    (run_dir / "pairs" / ".part-00000-of-00002.parquet.x1.tmp").write_bytes(b"half a shard")  # a killed writer's
    stale = run_dir / "variants" / "part-00002-of-00003.parquet"  # a shard of another layout (3 shards)
    stale.write_bytes(b"PAR1")

    _mine(corpus, tmp_path, "ref")
    counts = _counts(run_dir)
    damaged = {"embeddings", "neighbours", "scores", "ipw", "negate"}
    assert {s: c for s, c in counts.items() if s in damaged} == {s: (1, 1) for s in damaged}
    # the repaired shards have their old bytes again, so nothing downstream of them is recomputed
    assert all(counts[s] == (0, 2) for s in ORDER if s not in damaged)
    assert not stale.exists() and not list(run_dir.glob("*/*.tmp"))
    _assert_all_intact(run_dir)
    _assert_same_tables(_tables(run_dir), want, "after repairing damaged shards")


def test_corpus_changed_in_place_is_detected(reference, rows, tmp_path):
    """Same name, same size, same mtime, one word different: the content hash is the key, not the file's name."""
    ref_dir, _ = reference
    corpus = write_corpus(tmp_path / "corpus" / "hostile.txt", rows)
    run_dir = tmp_path / "runs" / "ref"
    shutil.copytree(ref_dir, run_dir)
    assert _manifest(run_dir, "sentences")["extra"] == "corpus:" + file_hash(corpus)  # this run dir matches it
    st, data = corpus.stat(), corpus.read_bytes()
    old = wiki_lines(44)[10].encode()
    new = old.replace(b"e", b"a", 1)
    assert old != new and data.count(old) == 1
    corpus.write_bytes(data.replace(old, new))
    os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert corpus.stat().st_size == st.st_size

    _mine(corpus, tmp_path / "runs", "ref")
    assert _counts(run_dir)["sentences"] == (2, 0)
    texts = _tables(run_dir)["sentences"].column("text").to_pylist()
    assert new.decode() in texts and old.decode() not in texts
    clean = _mine(corpus, tmp_path / "clean", "clean")
    _assert_same_tables(_tables(run_dir), _tables(clean.run.dir), "changed corpus vs a clean run of it")


# ---------------------------------------------------------------- config, corpus and model errors: exit 2, one line

def _cli_error(capsys, root: Path, argv: list[str], sets: list[str] = ()) -> str:
    capsys.readouterr()
    code = cli_main([*argv, "--set", *SMALL, f"run.root={root}", *sets])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert not root.exists() or not any(root.iterdir()), f"{argv}: wrote under the run root"
    return lines[0]


CONFIG_ERRORS = [
    (["neighbours.pool_sise=8"], "neighbours.pool_sise: unknown key"),
    (["nieghbours.pool_size=8"], "nieghbours: unknown key"),
    (["neighbours.pool_size=eight"], "neighbours.pool_size: Input should be a valid integer"),
    (["run.shards=[1,2]"], "run.shards: Input should be a valid integer"),
    (["neighbours.lo=0.8", "neighbours.hi=0.2"], "neighbours.lo (0.8) > neighbours.hi (0.2)"),
    (["neighbours.lo=0.8 neighbours.hi=0.2"], "neighbours.lo (0.8) > neighbours.hi (0.2)"),  # make's SET="a b"
    (["neighbours.lo=1.5"], "neighbours.lo: Input should be less than or equal to 1"),
    (["ipw.m_neg=9"], "ipw.m_neg (9) > neighbours.pool_size (8)"),
    (["ipw.temperature=0"], "ipw.temperature: Input should be greater than 0"),
    (["ipw.temperature=-0.5"], "ipw.temperature: Input should be greater than 0"),
    (["ipw.lambda_neg=1.2"], "ipw.lambda_neg: Input should be less than or equal to 1"),
    (["paraphrases.mer_lo=0.9", "paraphrases.mer_hi=0.1"], "paraphrases.mer_lo (0.9) > paraphrases.mer_hi (0.1)"),
    (["sentences.min_words=9", "sentences.max_words=4"], "sentences.min_words (9) > sentences.max_words (4)"),
    (["noise.min_ops=3"], "noise.min_ops (3) > noise.max_ops (2)"),
    (["run.shards=0"], "run.shards: Input should be greater than or equal to 1"),
    (["encoder.max_length=2"], "encoder.max_length: Input should be greater than or equal to 4"),
    (["runner.kind=dask"], "runner.address is required"),
    (["run.name=../escape"], "run.name: String should match pattern"),
    (["neighbours.pool_size"], "'neighbours.pool_size': expected key=value"),
]


@pytest.mark.parametrize("sets,message", CONFIG_ERRORS, ids=[s[0] for s, _ in CONFIG_ERRORS])
def test_config_error_is_one_line_naming_the_key(capsys, tmp_path, sets, message):
    line = _cli_error(capsys, tmp_path / "runs", ["mine", "--corpus", str(tmp_path / "c.txt")], sets)
    assert message in line


def test_input_errors_name_the_path_or_model(capsys, tmp_path):
    corpus = write_corpus(tmp_path / "c.txt", plain_rows(wiki_lines(3)))
    root = tmp_path / "runs"
    missing = tmp_path / "no-such-dir" / "corpus.txt"
    assert str(missing) in _cli_error(capsys, root, ["mine", "--corpus", str(missing)])
    assert str(tmp_path) in _cli_error(capsys, root, ["mine", "--corpus", str(tmp_path)])  # a directory
    assert "profile 'no-such-profile' not found" in _cli_error(capsys, root, ["mine", "--profile", "no-such-profile"])
    no_text, int_text, fake = tmp_path / "no-text.parquet", tmp_path / "int-text.parquet", tmp_path / "fake.parquet"
    pq.write_table(pa.table({"sentence": ["one two three"]}), no_text)
    pq.write_table(pa.table({"text": [1, 2, 3]}), int_text)
    fake.write_bytes(corpus.read_bytes())  # a text file named .parquet
    utf16 = tmp_path / "utf16.txt"  # what "Unicode" in some editors' save dialogs writes
    utf16.write_text("\n".join(wiki_lines(3)), encoding="utf-16")
    for path, message in [(no_text, "string column `text`"), (int_text, "column `text` is int64"),
                          (fake, "Parquet magic bytes not found"), (utf16, "UTF-16/UTF-32 text")]:
        line = _cli_error(capsys, root, ["mine", "--corpus", str(path)])
        assert str(path) in line and message in line, line
    with pytest.raises(CorpusError, match="convert it to UTF-8"):  # in-process callers of the stage too
        split_sentences(utf16, 3, 128, 2000)
    (tmp_path / "not-a-model").mkdir()
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # conftest: the hub id below must fail fast, offline
    cases = [
        (["encoder.model=/nonexistent/path"], "encoder /nonexistent/path: no such directory"),
        (["encoder.model=contramine-test/no-such-model"], "encoder 'contramine-test/no-such-model' is not available"),
        ([f"encoder.model={tmp_path / 'not-a-model'}"], "not-a-model: directory has no config.json"),
        (["negate.model=xx_no_such_pipeline"], "spaCy pipeline 'xx_no_such_pipeline' is not installed"),
        (['backtranslate.chains=[["contramine-test/no-mt", "contramine-test/no-mt-back"]]',
          "backtranslate.fallback=false"],
         "translation model 'contramine-test/no-mt'"),
    ]
    for sets, message in cases:
        line = _cli_error(capsys, root, ["mine", "--corpus", str(corpus)], sets)
        assert message in line, (sets, line)


def _run_cli(args: list[str], **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env=_cli_env(**env), timeout=300)


def test_cli_subprocess_stage_before_its_input(tmp_path):
    """The real `python -m flows.cli stage neighbours` on a fresh run: exit 2, one line saying what to run first."""
    root = tmp_path / "runs"
    r = _run_cli(["stage", "neighbours", "--run", "fresh", "--set", *SMALL, f"run.root={root}"])
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: stage neighbours reads table `embeddings`, which run 'fresh' does not have")
    assert "run `make stage STAGE=embeddings RUN=fresh`" in r.stderr
    assert not root.exists() or not any(root.iterdir())


def test_single_stage_before_its_inputs(capsys, reference, tmp_path):
    root = tmp_path / "runs"
    line = _cli_error(capsys, root, ["stage", "embeddings", "--run", "fresh"])
    assert "STAGE=sentences" in line
    # a copy of the reference run without `neighbours`: scores must say which stage to run first
    shutil.copytree(reference[0], tmp_path / "copy" / "ref")
    shutil.rmtree(tmp_path / "copy" / "ref" / "neighbours")
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "copy").rglob("*"))
    code = cli_main(["stage", "scores", "--run", "ref", "--set", *SMALL, f"run.root={tmp_path / 'copy'}"])
    line = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in line and "reads table `neighbours`" in line and "STAGE=neighbours" in line
    code = cli_main(["stage", "neighbours", "--run", "ref", "--set", *SMALL, "run.shards=3",
                     f"run.root={tmp_path / 'copy'}"])
    line = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in line and "has 2 shards but run.shards is 3" in line
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "copy").rglob("*")) == before


def test_single_stage_on_a_damaged_input_then_repair(capsys, reference, tmp_path):
    """`make stage` after an input shard was damaged: one line naming table, shard and the stage that repairs it;
    running that stage alone repairs it (same bytes), and the next stage then reuses its own shards."""
    root, run_dir = tmp_path / "copy", tmp_path / "copy" / "ref"
    shutil.copytree(reference[0], run_dir)
    p = run_dir / "embeddings" / "part-00000-of-00002.parquet"
    p.write_bytes(p.read_bytes()[:100])
    (run_dir / "embeddings" / "part-00001-of-00002.parquet").unlink()
    sets = ["--set", *SMALL, f"run.root={root}", "neighbours.lo=0.3"]  # neighbours must recompute: it reads them
    capsys.readouterr()
    code = cli_main(["stage", "neighbours", "--run", "ref", *sets])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert "table `embeddings`" in err and "[0, 1]" in err and "STAGE=embeddings" in err
    assert cli_main(["stage", "embeddings", "--run", "ref", *sets]) == 0
    assert _counts(run_dir)["embeddings"] == (2, 0)
    assert Store(run_dir).read("embeddings").equals(reference[1]["embeddings"])
    assert cli_main(["stage", "neighbours", "--run", "ref", *sets]) == 0
    assert _counts(run_dir)["neighbours"] == (2, 0)
