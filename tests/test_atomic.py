"""Atomic writes shared by the mining stages and the trainer's checkpoints (pipeline/storage/atomic.py)."""
import os

import pytest

from contramine.pipeline.storage.atomic import _umask, atomic_dir, atomic_file, atomic_write_json, recover
from contramine.pipeline.storage.safe_paths import UnsafePath, make_dirs, open_folder, walk


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


# ---- links (pipeline/storage/safe_paths.py): never written, renamed or deleted through -------------------------------
def _victim(tmp_path):
    v = tmp_path / "victim"
    (v / "sub").mkdir(parents=True)
    (v / "f").write_text("precious")
    (v / "sub" / "g").write_text("precious too")
    return v, sorted((p.relative_to(v), p.read_bytes() if p.is_file() else None) for p in v.rglob("*"))


def _same(v, before) -> bool:
    return sorted((p.relative_to(v), p.read_bytes() if p.is_file() else None) for p in v.rglob("*")) == before


def test_a_link_below_the_root_is_refused_a_link_at_the_root_is_not(tmp_path):
    v, before = _victim(tmp_path)
    (tmp_path / "run").symlink_to(v)  # the root itself may be a link (a run on a bigger disk)
    atomic_write_json(tmp_path / "run" / "x.json", {"a": 1}, root=tmp_path / "run")
    assert (v / "x.json").is_file()
    (v / "x.json").unlink()
    real = tmp_path / "r"
    (real / "a").mkdir(parents=True)
    (real / "a" / "b").symlink_to(v)
    for write in (lambda: atomic_write_json(real / "a" / "b" / "c" / "f", {}, root=real),
                  lambda: atomic_dir(real / "a" / "b", root=real).__enter__(),
                  lambda: atomic_dir(real / "a" / "b" / "sub", root=real).__enter__(),
                  lambda: make_dirs(real, real / "a" / "b" / "new")):
        with pytest.raises(UnsafePath, match=rf"^{real / 'a' / 'b'} is a symbolic link inside {real} \(to {v}\)"):
            write()
    assert _same(v, before)


def test_a_link_swapped_in_after_the_folder_was_opened_is_not_followed(tmp_path):
    """The writer opened a/ (no link then); someone moves it and puts a link to the victim in its place while the
    file is written: the file lands in the folder that was opened, nothing in the link's target."""
    v, before = _victim(tmp_path)
    run = tmp_path / "run"
    (run / "a").mkdir(parents=True)
    with atomic_file(run / "a" / "f", root=run) as tmp:
        os.rename(run / "a", run / "moved")
        (run / "a").symlink_to(v)
        tmp.write_text("mine")
    assert (run / "moved" / "f").read_text() == "mine" and _same(v, before)
    with atomic_dir(run / "moved" / "d", root=run) as tmp:
        os.rename(run / "moved", run / "moved-again")
        (run / "moved").symlink_to(v)
        (tmp / "g").write_text("mine")
    assert (run / "moved-again" / "d" / "g").read_text() == "mine" and _same(v, before)


def test_swaps_and_recovery_remove_links_as_links(tmp_path):
    v, before = _victim(tmp_path)
    dst = tmp_path / "last"
    with atomic_dir(dst) as d:
        (d / "f").write_text("one")
        (d / "inner").symlink_to(v)  # a link inside the folder it replaces: the swap's cleanup never follows it
    (tmp_path / ".last.old").symlink_to(v)  # planted where a killed swap leaves its old folder
    (tmp_path / ".last.tmp-x").symlink_to(v)  # and where it leaves its temp folder
    (tmp_path / ".last.tmp-y").mkdir()
    (tmp_path / ".last.tmp-y" / "link").symlink_to(v)
    with atomic_dir(dst) as d:
        (d / "f").write_text("two")
    assert (dst / "f").read_text() == "two" and sorted(p.name for p in tmp_path.iterdir()) == ["last", "victim"]
    assert _same(v, before)


def test_folder_deletes_only_names_the_caller_writes(tmp_path):
    import re

    v, before = _victim(tmp_path)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "part-1").symlink_to(v / "f")
    (tmp_path / "t" / "part-2").mkdir()
    (tmp_path / "t" / "other").write_text("x")
    own = re.compile(r"part-\d")
    with open_folder(tmp_path, tmp_path / "t") as d:
        assert [d.unlink(n, own) for n in ("part-1", "part-2", "other", "part-1")] == [True, False, False, False]
        assert d.rmtree("other", own) is False
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["other", "part-2"] and _same(v, before)


def test_walk_never_follows_a_link_nor_loops(tmp_path):
    v, _ = _victim(tmp_path)
    run = tmp_path / "run"
    (run / "train" / "x").mkdir(parents=True)
    (run / "train" / "x" / "events").write_text("e")
    (run / "train" / "loop").symlink_to("..")
    (run / "train" / "out").symlink_to(v)
    (run / "train" / "x" / "link").symlink_to(v / "f")
    got = [(str(p.relative_to(run)), files) for p, files in walk(run)]
    assert got == [(".", []), ("train", []), ("train/x", ["events"])]
