"""Every read of a run folder is bounded before it is parsed, and the verified-read cache cannot be fooled
(pipeline/storage/{manifest,verify,store}.py): a sparse 1 GiB manifest and a shard grown to 8 GiB are one line at
once (fstat against a size limit; the shard's size recorded in its manifest entry, compared before hashing); JSON
nested 100,000 deep in a manifest, a sidecar or `.verified.json` is one line or ignored, never a traceback; a shard
rewritten in place with its mtime restored is hashed again (the cache keys on ctime and device too); what a commit
writes is read-only and the cache is its user's alone. Each case is a reproduction from issue 62."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from child_env import CHILD_PYTHONPATH, ROOT
from contramine.pipeline.storage.manifest import MANIFEST, TableCorrupt
from contramine.pipeline.storage.store import Store
from contramine.pipeline.storage.tables import RunTables, TableUnreadable
from contramine.pipeline.storage.verify import CACHE
from test_manifest_shapes import _command, _mined

# `contramine <args>` in a child that prints its own peak RSS (MiB) last: a command's memory, not the test's
MEASURED = """
import sys
from contramine.flows.cli import main
code = main(sys.argv[1:])
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print("peak_mib", int(hwm.split()[1]) // 1024, "code", code)
"""
# (VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork and exec, so a child of a test
# process that grew reported the test's peak)


def _measured(args: list[str]) -> tuple[int, int, str, float]:
    """(exit code, peak RSS in MiB, stderr, seconds) of `contramine <args>` in a child."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", MEASURED, *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": CHILD_PYTHONPATH})
    seconds = time.perf_counter() - t0
    words = p.stdout.split()
    return int(words[words.index("code") + 1]), int(words[words.index("peak_mib") + 1]), p.stderr, seconds


def _entries(run: Path, table: str) -> list[dict]:
    return json.loads((run / table / MANIFEST).read_text())["files"]


def test_a_sparse_1_gib_manifest_is_one_line_at_once(tmp_path):
    """`sql`'s peak memory is what it takes on an intact run (~170 MiB here), not 1.5 GB more."""
    root = tmp_path / "runs"
    run = _mined(root)
    _, intact, _, intact_s = _measured(_command("sql", root))
    os.truncate(run / "sentences" / MANIFEST, 1 << 30)  # 0 bytes on disk
    code, peak, err, seconds = _measured(_command("sql", root))
    last = err.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in err and "1,073,741,824 bytes, more than any manifest" in last, err
    assert peak < intact + 64 and seconds < 2 * intact_s + 5, (peak, intact, seconds, intact_s)


def test_a_shard_grown_to_8_gib_is_one_line_without_hashing(tmp_path):
    root = tmp_path / "runs"
    run = _mined(root)
    shard = run / "sentences" / _entries(run, "sentences")[0]["file"]
    size = shard.stat().st_size
    assert _entries(run, "sentences")[0]["bytes"] == size  # recorded at the commit
    os.truncate(shard, 8 << 30)
    t0 = time.perf_counter()
    with pytest.raises(TableUnreadable, match=rf"{shard.name} is damaged: 8,589,934,592 bytes where its manifest "
                                              rf"records {size:,} .*not hashed"):
        RunTables(run).files("sentences")
    assert time.perf_counter() - t0 < 2  # hashing 8 GiB took 35 s
    code, _, err, _ = _measured(_command("sql", root))
    assert code == 2 and "8,589,934,592 bytes" in err.strip().splitlines()[-1] and "Traceback" not in err


def test_a_manifest_without_sizes_stays_readable(tmp_path):
    run = _mined(tmp_path / "runs")
    want = RunTables(run).read("sentences")
    path = run / "sentences" / MANIFEST
    man = json.loads(path.read_text())
    man["files"] = [{k: v for k, v in e.items() if k != "bytes"} for e in man["files"]]  # what older code wrote
    path.unlink()
    path.write_text(json.dumps(man))
    assert RunTables(run).read("sentences").equals(want)
    assert Store(run).read_shard("sentences", 0, 2).num_rows == 6


def test_json_nested_100000_deep_is_one_line_or_ignored(tmp_path, capsys):
    from contramine.flows.cli import main

    root = tmp_path / "runs"
    run = _mined(root)
    deep = "[" * 100_000
    assert main(_command("sql", root)) == 0  # .verified.json written
    (run / CACHE).unlink()
    (run / CACHE).write_text(deep)
    capsys.readouterr()
    assert main(_command("sql", root)) == 0  # a cache that does not parse is no cache: hashed again
    entry = _entries(run, "sentences")[1]
    side = (run / "sentences" / entry["file"]).with_suffix(".json")
    side.unlink()
    side.write_text(deep)
    assert Store(run).cached_shard("sentences", 1, 2, "k1") is None  # a sidecar that does not parse: recomputed
    (run / "sentences" / MANIFEST).unlink()
    (run / "sentences" / MANIFEST).write_text(deep)
    capsys.readouterr()
    assert main(_command("sql", root)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "not a manifest (invalid JSON)" in err.strip().splitlines()[-1]
    with pytest.raises(TableCorrupt, match="invalid JSON"):
        Store(run).read_shard("sentences", 0, 2)


@pytest.mark.parametrize("pad", ["{}", "0.5", "9" * 5000], ids=["22M-empty-objects", "16M-numbers", "5000-digits"])
def test_a_manifest_cheap_in_bytes_but_dear_to_parse_is_one_line(tmp_path, pad):
    """Under the size limit, but 22M `{}` (~2 GB parsed, 3.5 GB in `report`), 16M numbers, or one number of more
    digits than Python converts (its ValueError was a traceback in sql, verify, report and export): one line."""
    root = tmp_path / "runs"
    run = _mined(root)
    man = run / "sentences" / MANIFEST
    raw = man.read_text().rstrip()
    intact = {cmd: _measured(args)[1] for cmd, args in (("sql", _command("sql", root)),
                                                         ("verify", ["verify", "--run", "r", "--set", f"run.root={root}"]))}
    n = 1 if len(pad) > 3 else (63 << 20) // (len(pad) + 1)
    man.chmod(0o644)
    man.write_text(raw[:-1] + ', "extra_pad": [' + pad + ("," + pad) * (n - 1) + "]}")
    for args in (_command("sql", root), ["verify", "--run", "r", "--set", f"run.root={root}"]):
        code, peak, err, _ = _measured(args)
        assert code == 2 and "Traceback" not in err, err[-2000:]
        assert peak < intact[args[0]] + 200, (peak, intact, err[-500:])
        assert args[0] == "verify" or "sentences/_manifest.json" in err  # (verify names it on stdout)


def _forged_same_size(shard: Path) -> bytes:
    """The shard's table with one row's text changed, as valid Parquet with page checksums, padded to the shard's
    size (zeros between the last column chunk and the footer, which readers find from the end)."""
    table = pq.read_table(shard)
    texts = table.column("text").to_pylist()
    texts[0] = "forged"
    sink = pa.BufferOutputStream()
    pq.write_table(table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts)), sink,
                   compression="zstd", write_page_checksum=True)
    forged, size = sink.getvalue().to_pybytes(), shard.stat().st_size
    assert len(forged) <= size
    footer = len(forged) - 8 - int.from_bytes(forged[-8:-4], "little")
    return forged[:footer] + bytes(size - len(forged)) + forged[footer:]


def test_a_shard_rewritten_in_place_with_its_mtime_restored_is_refused(tmp_path):
    """Same inode, same size, valid page checksums, mtime set back: only the ctime (which no user can set back)
    tells, and the remembered check no longer counts."""
    run = _mined(tmp_path / "runs")
    assert RunTables(run).read("sentences").num_rows == 12  # a warm check, remembered in .verified.json
    shard = run / "sentences" / _entries(run, "sentences")[0]["file"]
    before = shard.stat()
    forged = _forged_same_size(shard)
    time.sleep(0.05)  # past the file system's timestamp granularity
    shard.chmod(0o644)  # a committed shard is 0444: the edit takes a chmod (as root, not even that)
    with open(shard, "r+b") as f:
        f.write(forged)
    shard.chmod(0o444)
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = shard.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    assert pq.read_table(shard, page_checksum_verification=True).column("text")[0].as_py() == "forged"
    with pytest.raises(TableUnreadable, match=f"{shard.name} is damaged"):
        RunTables(run).read("sentences")
    with pytest.raises(TableCorrupt, match=f"{shard.name} is damaged"):
        Store(run).read_shard("sentences", 0, 2)


def test_committed_files_are_read_only_and_the_cache_only_its_users(tmp_path):
    """Shards, sidecars and manifests 0444; `.verified.json` 0600, and one that others may write vouches for
    nothing: a hand-written entry for a damaged shard is not served."""
    run = _mined(tmp_path / "runs")
    RunTables(run).read("sentences")
    for p in (run / "sentences").iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o444, p
    assert stat.S_IMODE((run / CACHE).stat().st_mode) == 0o600
    entry = _entries(run, "sentences")[0]
    shard = run / "sentences" / entry["file"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.unlink()
    shard.write_bytes(bytes(data))  # damaged, same size
    st = shard.stat()
    cache = json.loads((run / CACHE).read_text())
    cache[f"sentences/{shard.name}"] = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                                        entry["hash"]]
    (run / CACHE).write_text(json.dumps(cache))
    (run / CACHE).chmod(0o664)  # under a umask of 002: a group member could have written that entry
    with pytest.raises(TableUnreadable, match=f"{shard.name} is damaged"):
        RunTables(run).read("sentences")


def test_a_shard_is_hashed_once_by_its_writer_and_an_edit_in_place_is_still_caught(tmp_path, monkeypatch):
    """The commit's check of a shard this process has just written, and a rerun's look at it (in this process, or
    in another through `.verified.json`), take a fstat, not a second hash of the file; a byte flipped in place with
    the mtime set back is hashed again and refused all the same."""
    from contramine.pipeline.storage import verify

    hashed: list[str] = []
    real = verify.content_hash
    monkeypatch.setattr(verify, "content_hash", lambda f: hashed.append(str(f.name)) or real(f))
    store = Store(tmp_path / "run")
    parts = [pa.table({"sid": pa.array([i], pa.int64()), "text": [f"line {i}"], "n_words": pa.array([2], pa.int32()),
                       "line_no": pa.array([i], pa.int64())}) for i in range(3)]
    store.write_table("sentences", parts, key="k")
    assert len(hashed) == 3  # one hash a shard: the writer's, right after the rename; the commit's check is a fstat
    assert [store.cached_shard("sentences", i, 3, "k") is not None for i in range(3)] == [True] * 3
    monkeypatch.setattr(verify, "_HASHED", {})  # another process: what vouches is the run's .verified.json
    assert [Store(tmp_path / "run").cached_shard("sentences", i, 3, "k") is not None for i in range(3)] == [True] * 3
    assert [Store(tmp_path / "run").intact("sentences", i, 3) for i in range(3)] == [True] * 3  # `stage`'s preflight
    assert len(hashed) == 3

    shard = store.shard_path("sentences", 0, 3, "k")
    before = shard.stat()
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    time.sleep(0.05)  # past the file system's timestamp granularity
    shard.chmod(0o644)
    with open(shard, "r+b") as f:
        f.write(bytes(data))
    shard.chmod(0o444)
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert Store(tmp_path / "run").cached_shard("sentences", 0, 3, "k") is None  # hashed again: not reused
    assert not Store(tmp_path / "run").intact("sentences", 0, 3)  # what that hash found is remembered: damaged
    assert len(hashed) == 4
    with pytest.raises(TableCorrupt, match=f"{shard.name} is damaged"):
        store.read_shard("sentences", 0, 3)
