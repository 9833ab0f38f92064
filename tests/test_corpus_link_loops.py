"""Corpus links that never end, and names that carry terminal escapes (found by a review of the landed code, issue
62's "checked on cases you have not seen"): a link to itself in a corpus folder or glob was an OSError traceback; a
`**` glob over a folder with two links to `.` listed ~2^40 paths (a hang); an unrecognised argument, a dangling
link's name and target, and `python -m contramine.pipeline.report`'s errors reached the terminal raw."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from child_env import CHILD_PYTHONPATH, ROOT
from contramine.flows.cli import main
from contramine.pipeline.corpus.parts import find_parts
from contramine.pipeline.corpus.records import CorpusError

ESC = "\x1b[31mRED"


def _corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "ok.txt").write_text("one two three four five\n")
    return folder


@pytest.mark.parametrize("form", ["folder", "glob"])
def test_a_link_to_itself_is_one_line_naming_it(tmp_path, form):
    folder = _corpus(tmp_path)
    (folder / "loopy").symlink_to("loopy")
    spec = str(folder) if form == "folder" else f"{folder}/*"
    with pytest.raises(CorpusError, match=r"loopy: cannot read it \(Too many levels of symbolic links\)"):
        find_parts(spec)


def test_a_recursive_glob_through_links_to_its_own_folder_stops_in_one_line(tmp_path):
    folder = _corpus(tmp_path)
    (folder / "a").symlink_to(".")
    (folder / "b").symlink_to(".")
    (folder / "sub").mkdir()  # and a loop in a folder with nothing the glob matches (it yielded nothing to check)
    (folder / "sub" / "l1").symlink_to(".")
    (folder / "sub" / "l2").symlink_to(".")
    t0 = time.perf_counter()
    for spec in (f"{folder}/**/*.txt", f"{folder}/**/*.jsonl"):
        with pytest.raises(CorpusError, match="is a folder reached twice through links"):
            find_parts(spec)
    assert time.perf_counter() - t0 < 10
    (tmp_path / "plain").mkdir()
    assert [p.name for p in find_parts(f"{_corpus(tmp_path / 'plain')}/**/*.txt")] == ["ok.txt"]  # no link: as before


def test_escapes_in_names_never_reach_the_terminal_raw(tmp_path, capsys, caplog):
    with pytest.raises(SystemExit):
        main(["report", "--run", "x", ESC])  # argparse's own "unrecognized arguments" line
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[31mRED" in err
    folder = _corpus(tmp_path)
    (folder / f"d{ESC}.txt").symlink_to(f"/nonexistent{ESC}")
    with caplog.at_level(logging.WARNING):
        find_parts(str(folder))
    warned = [r.getMessage() for r in caplog.records if "does not exist" in r.getMessage()]
    assert len(warned) == 1 and "\x1b" not in warned[0] and warned[0].count("\\x1b") == 2
    p = subprocess.run([sys.executable, "-m", "contramine.pipeline.report", f"/tmp/no{ESC}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": CHILD_PYTHONPATH})
    assert p.returncode == 2 and "\x1b" not in p.stderr and "\\x1b[31mRED" in p.stderr, p.stderr


def test_a_part_swapped_between_link_and_file_while_resolved_is_one_line(tmp_path, monkeypatch):
    """realpath lstat's, then readlink's: a part that stops being a link in between raised EINVAL (a traceback)."""
    import errno

    import contramine.pipeline.corpus.parts as parts

    folder, resolve = _corpus(tmp_path), os.path.realpath

    def swapped(path, *args, **kwargs):
        if str(path).endswith("ok.txt"):
            raise OSError(errno.EINVAL, "Invalid argument", str(path))
        return resolve(path, *args, **kwargs)
    monkeypatch.setattr(parts.os.path, "realpath", swapped)
    with pytest.raises(CorpusError, match=r"ok.txt changed while the corpus was listed \(Invalid argument\)"):
        find_parts(str(folder))
