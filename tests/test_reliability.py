"""What a user relies on: hostile corpora, kill -9 mid-run, determinism, damaged caches (degenerate corpora are in
test_degenerate.py, config and input errors in test_cli_errors.py).

Every mining run here uses tiny corpora (at most 70 lines) and the small settings of test_mine_flow.py. Mining runs
in-process under `prefect_harness`; where a process must die or an exit code matters, the CLI runs in a subprocess
(`tests/hostile.py` = `python -m contramine.flows.cli` plus a pause hook), pointed at the harness' Prefect server so that it
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
| missing corpus file (and folder); a corpus folder with no corpus | E: names the path                             |
|    file in it                                                    |                                               |
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
import pytest

from contramine.flows.cli import main as cli_main
from contramine.pipeline.config import SentencesCfg
from contramine.pipeline.corpus import as_corpus
from contramine.pipeline.schema import table_vectors
from contramine.pipeline.storage.store import Store, file_hash
from contramine.pipeline.storage.tables import RunTables

from hostile import KEPT, hostile_rows, wiki_lines, write_corpus

from mining_helpers import (ORDER, ROOT, SMALL, STAGES, TABLES, _brute_force, _cli_env, _cli_error,
                            _manifest, _mine, _tables)

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _assert_same_tables(got: dict, want: dict, what: str) -> None:
    for table, data in want.items():
        assert got[table].equals(data), f"table {table} differs: {what}"


def _counts(run_dir: Path) -> dict[str, tuple[int, int]]:
    """(shards_computed, shards_cached) of every stage's last run."""
    return {s: (m["shards_computed"], m["shards_cached"]) for s in ORDER
            if (m := _manifest(run_dir, STAGES[s].writes[0]))}


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


def _memo_of(reference) -> str:
    """The reference run's row memo (<run.root>/.memo), shared as a team shares one (runner.memo_dir): the runs that
    test what shards are reused, not what the models compute, take the model rows from it, so a killed or resumed
    shard costs its stage's bookkeeping, not the encoder's time. (The memo's own faults: test_memo_trust.py,
    test_row_memo_mining.py; the determinism runs keep a memo of their own.)"""
    return f"runner.memo_dir={reference[0].parent / '.memo'}"


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
    rej_chars = dict(zip(rejected.column("line_no").to_pylist(), rejected.column("n_chars").to_pylist()))
    keep = SentencesCfg().rejected_chars  # 2,000: the 50,000-character lines are cut, their lengths kept whole
    assert keep == 2000
    for no, reason in want.items():
        raw = rows[no - 1][0]
        if reason == "undecodable":
            assert rej_text[no] == raw.decode("utf-8", errors="replace")[:keep] and "\ufffd" in rej_text[no]
        else:
            assert rej_text[no] == raw.decode("utf-8")[:keep]  # whole up to rejected_chars, then its first ones
        assert rej_chars[no] == len(raw.decode("utf-8", errors="replace"))  # the whole line's length, always
    assert max(len(s) for s in rej_text.values()) == keep and max(rej_chars.values()) == 50_000
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


@pytest.mark.parametrize("name,extra", [("one-shard", ["run.shards=1"]),
                                        ("seven-shards-four-threads", ["run.shards=7", "runner.workers=4"])])
def test_same_tables_whatever_the_shards_and_workers(reference, corpus, tmp_path, name, extra):
    """Tables independent of shards and threads: the suite's one such check (Dask: test_scaleout, test_cluster)."""
    cfg = _mine(corpus, tmp_path, name, *extra)
    _assert_same_tables(_tables(cfg.run.dir), reference[1], f"with {extra}")


# ---------------------------------------------------------------- kill -9 and resume

def _killed_mine(corpus: Path, root: Path, tmp: Path, *sets: str, pause_at: str | None = None,
                 kill_when: str | None = None, timeout: float = 300) -> None:
    """Start `mine` in a subprocess; SIGKILL it when it reaches `pause_at` (the hook) or when the file pattern
    `kill_when` appears under the run dir (a moment the test does not choose)."""
    marker = tmp / f"paused-{time.monotonic_ns()}"
    env = _cli_env(CONTRAMINE_PAUSE_AT=pause_at or "", CONTRAMINE_PAUSE_MARKER=str(marker))
    cmd = [sys.executable, str(ROOT / "tests" / "hostile.py"), "mine", "--corpus", str(corpus), "--run", "faulty",
           "--set", *SMALL, f"run.root={root}", *sets]
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
    """Four kill -9 of a graph-scheduled mine (stages that do not read each other run at once, two jobs at a time,
    so what else had finished at each kill is not fixed), then a run to the end: no shard intact at a kill is
    rewritten, no temp file is left, and every table equals a clean run's. Each kill point is downstream of the one
    before, so each run reaches it (a kill at negate's shards was passed by runs that had finished negate)."""
    root, run_dir, memo = tmp_path / "runs", tmp_path / "runs" / "faulty", _memo_of(reference)
    _killed_mine(corpus, root, tmp_path, memo, pause_at="compute:embeddings:1")
    assert _manifest(run_dir, "sentences") is not None and not (run_dir / "embeddings" / "_manifest.json").exists()
    assert not list((run_dir / "embeddings").glob("part-00001-of-00002.*"))
    snap1 = _intact_shards(run_dir)

    _killed_mine(corpus, root, tmp_path, memo, pause_at="tmp:neighbours:1")
    _assert_untouched(snap1, "the run after the kill during embeddings")
    assert len(list((run_dir / "neighbours").glob(".part-00001-of-00002.*.parquet.*.tmp"))) == 1
    assert not list((run_dir / "neighbours").glob("part-00001-of-00002.*.parquet"))
    snap2 = _intact_shards(run_dir)

    _killed_mine(corpus, root, tmp_path, memo, pause_at="sidecar:candidates:0")
    _assert_untouched(snap2, "the run after the kill during a neighbours shard write")
    assert not list((run_dir / "neighbours").glob("*.tmp"))  # the killed writer's temp file collected
    [cand0] = (run_dir / "candidates").glob("part-00000-of-00002.*.parquet")
    assert not cand0.with_suffix(".json").exists()
    snap3 = _intact_shards(run_dir)

    # a moment the test does not choose: one pairs shard whole, and whatever else the graph was running then
    _killed_mine(corpus, root, tmp_path, memo, kill_when="pairs/part-0000*-of-00002.*.json")
    _assert_untouched(snap3, "the run after the kill during a candidates shard's sidecar")
    snap4 = _intact_shards(run_dir)
    assert sum(1 for s in snap4 if s.parent.name == "pairs") >= 1

    _mine(corpus, root, "faulty", memo)
    for snap in (snap1, snap2, snap3, snap4):
        _assert_untouched(snap, "the completing run")
    assert _counts(run_dir)["scores"] == (0, 2)  # finished before ipw started, in a killed run: reused
    _assert_all_intact(run_dir)
    _assert_same_tables(_tables(run_dir), reference[1], "after four kill -9 and a resume")


# ---------------------------------------------------------------- damaged caches between runs

def test_damaged_shards_are_recomputed_never_reused(reference, corpus, tmp_path):
    ref_dir, want = reference
    run_dir = tmp_path / "ref"
    shutil.copytree(ref_dir, run_dir)
    part = lambda table, i: Store(run_dir).shard_path(table, i, 2)  # noqa: E731  (the committed file)

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
    (run_dir / "pairs" / ".part-00000-of-00002.0123456789abcdef.parquet.x1.tmp").write_bytes(b"half")  # killed writer's
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
    before = as_corpus(corpus).identity()  # the parts' names, forms and content hashes
    assert _manifest(run_dir, "sentences")["extra"].startswith("corpus:" + before + ";")  # this run's
    st, data = corpus.stat(), corpus.read_bytes()
    old = wiki_lines(44)[10].encode()
    new = old.replace(b"e", b"a", 1)
    assert old != new and data.count(old) == 1
    corpus.write_bytes(data.replace(old, new))
    os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert corpus.stat().st_size == st.st_size and as_corpus(corpus).identity() != before

    memo = _memo_of(reference)  # the changed line is encoded once, by the rerun; the clean run reuses its vector
    _mine(corpus, tmp_path / "runs", "ref", memo)
    assert _counts(run_dir)["sentences"] == (2, 0)
    texts = _tables(run_dir)["sentences"].column("text").to_pylist()
    assert new.decode() in texts and old.decode() not in texts
    clean = _mine(corpus, tmp_path / "clean", "clean", memo)
    _assert_same_tables(_tables(run_dir), _tables(clean.run.dir), "changed corpus vs a clean run of it")


def test_single_stage_before_its_inputs(capsys, reference, tmp_path):
    root = tmp_path / "runs"
    line = _cli_error(capsys, root, ["stage", "embeddings", "--run", "fresh"])
    assert "contramine stage sentences --run" in line
    # a copy of the reference run without `neighbours`: scores must say which stage to run first
    shutil.copytree(reference[0], tmp_path / "copy" / "ref")
    shutil.rmtree(tmp_path / "copy" / "ref" / "neighbours")
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "copy").rglob("*"))
    code = cli_main(["stage", "scores", "--run", "ref", "--set", *SMALL, f"run.root={tmp_path / 'copy'}"])
    line = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in line and "reads table `neighbours`" in line and "contramine stage neighbours --run" in line
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
    p = Store(run_dir).shard_path("embeddings", 0, 2)
    p.write_bytes(p.read_bytes()[:100])
    Store(run_dir).shard_path("embeddings", 1, 2).unlink()
    sets = ["--set", *SMALL, f"run.root={root}", "neighbours.lo=0.3"]  # neighbours must recompute: it reads them
    capsys.readouterr()
    code = cli_main(["stage", "neighbours", "--run", "ref", *sets])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert "table `embeddings`" in err and "[0, 1]" in err and "contramine stage embeddings --run" in err
    assert cli_main(["stage", "embeddings", "--run", "ref", *sets]) == 0
    assert _counts(run_dir)["embeddings"] == (2, 0)
    assert RunTables(run_dir).read("embeddings").equals(reference[1]["embeddings"])
    assert cli_main(["stage", "neighbours", "--run", "ref", *sets]) == 0
    assert _counts(run_dir)["neighbours"] == (2, 0)


def test_a_one_job_stage_killed_between_its_shards_keeps_the_ones_it_wrote(corpus, tmp_path):
    """`sentences` writes all its shards in one job: killed after some of them were whole (here: one removed, as if
    never written), the rerun writes the missing one and leaves every whole shard of the same key untouched."""
    from contramine.pipeline.config import load_config
    from contramine.pipeline.engine.runner import run_job

    cfg = load_config("default", SMALL + [f"run.root={tmp_path}", "run.name=r", f"data.corpus={corpus}"])
    run_job("sentences", cfg)
    run_dir = tmp_path / "r"
    whole = _intact_shards(run_dir)
    lost = sorted((run_dir / "sentences").glob("part-00001-of-00002.*"))
    assert len(whole) == 4 and len(lost) == 2  # sentences and rejected, 2 shards each; a shard is its parquet + json
    for f in lost:
        f.unlink()
    run_job("sentences", cfg)
    _assert_untouched({s: v for s, v in whole.items() if s not in lost}, "the rerun of a one-job stage")
    assert all(f.exists() for f in lost)
