"""Atomic writes shared by the mining stages and the trainer's checkpoints (pipeline/engine/atomic.py)."""
import os

import pytest

from pipeline.engine.atomic import _umask, atomic_dir, atomic_write_json, recover


def test_atomic_dir_survives_errors_and_interrupted_swaps(tmp_path):
    dst = tmp_path / "last"
    with atomic_dir(dst) as d:
        (d / "f").write_text("one")
    with pytest.raises(RuntimeError):
        with atomic_dir(dst) as d:
            (d / "f").write_text("half")
            raise RuntimeError("killed while writing")
    assert (dst / "f").read_text() == "one" and [p.name for p in tmp_path.iterdir()] == ["last"]
    # a kill between the two renames leaves only .last.old: recover() puts it back
    os.rename(dst, tmp_path / ".last.old")
    (tmp_path / ".last.tmp-x").mkdir()
    assert recover(dst) == dst and (dst / "f").read_text() == "one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]
    assert dst.stat().st_mode & 0o777 == 0o777 & ~_umask()  # not mkdtemp's owner-only mode


def test_atomic_json_leaves_old_file_on_error(tmp_path):
    path = tmp_path / "m.json"
    atomic_write_json(path, {"a": 1})
    loop: dict = {}
    loop["self"] = loop
    with pytest.raises(ValueError):
        atomic_write_json(path, loop)  # not JSON: the old file stays whole, no temp file lingers
    assert path.read_text().replace(" ", "").replace("\n", "") == '{"a":1}'
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]
