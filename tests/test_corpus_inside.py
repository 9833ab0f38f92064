"""A corpus is what is inside it (issue 52): a link in a corpus folder or glob that leads outside the corpus is
refused in one line (data.outside_links allows it), so no line of that file reaches a table; a dangling link gets a
warning line; a FIFO, socket or device, as the corpus or in it, is one line naming it, never a hang; an `hf:` id
goes through the hub's id validation and never names a local path; a folder's identity covers its content."""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from contramine.pipeline.corpus import Corpus, CorpusError, split_sentences
from contramine.pipeline.corpus.streams import open_file

from mining_helpers import _cli_env

SECRET = "aws_secret_access_key = a line that must never reach a table"
LINES = "the first sentence of the corpus\nthe second sentence of the corpus\n"


@pytest.fixture
def corpus(tmp_path):
    """parts/ with a file, and a secret beside it (outside the corpus)."""
    (tmp_path / "parts" / "sub").mkdir(parents=True)
    (tmp_path / "parts" / "a.txt").write_text(LINES)
    (tmp_path / "secret.txt").write_text(SECRET + "\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "more.txt").write_text(SECRET + "\n")
    return tmp_path


def _every_text(corpus: Corpus) -> list[str]:
    kept, rejected = split_sentences(corpus, 3, 30, 200)
    return kept.column("text").to_pylist() + rejected.column("text").to_pylist()


def test_a_link_leading_outside_the_corpus_is_refused_naming_it(corpus):
    parts = corpus / "parts"
    (parts / "b.txt").symlink_to(corpus / "secret.txt")
    for spec in (str(parts), str(parts / "*.txt"), str(parts / "**" / "*.txt")):
        with pytest.raises(CorpusError) as e:
            _every_text(Corpus(spec))
        msg = str(e.value)
        assert "\n" not in msg and f"b.txt leads outside the corpus (to {corpus / 'secret.txt'})" in msg, spec
        assert "data.outside_links=true" in msg
        with pytest.raises(CorpusError, match="leads outside"):
            Corpus(spec).identity()  # the key never hashes it either
    assert SECRET in _every_text(Corpus(str(parts), outside_links=True))  # the setting allows it


def test_a_folder_link_leading_outside_is_refused_through_a_glob_and_not_walked(corpus):
    parts = corpus / "parts"
    (parts / "sub" / "out").symlink_to(corpus / "outside", target_is_directory=True)
    with pytest.raises(CorpusError, match=r"sub/out/more.txt leads outside the corpus"):
        Corpus(str(parts / "**" / "*.txt")).check()  # glob's ** follows the folder link: its files are refused
    assert SECRET not in _every_text(Corpus(str(parts)))  # a folder's walk does not follow folder links


def test_links_that_stay_inside_are_read(corpus):
    parts = corpus / "parts"
    (parts / "sub" / "c.txt").write_text("a third sentence in a sub folder\n")
    (parts / "z.txt").symlink_to(parts / "sub" / "c.txt")
    kept, rejected = split_sentences(Corpus(str(parts)), 3, 30, 200)
    assert "a third sentence in a sub folder" in kept.column("text").to_pylist()
    assert rejected.select(["source", "reason"]).to_pylist() == [{"source": "z.txt", "reason": "duplicate"}]


def test_a_dangling_link_in_a_folder_gets_a_line(corpus, caplog):
    (corpus / "parts" / "gone.txt").symlink_to(corpus / "nowhere.txt")
    with caplog.at_level(logging.WARNING, logger="contramine.corpus"):
        Corpus(str(corpus / "parts")).check()
        kept, _ = split_sentences(Corpus(str(corpus / "parts")), 3, 30, 200)
    assert kept.num_rows == 2
    assert [r.getMessage() for r in caplog.records] == [
        f"corpus folder {corpus / 'parts'}: skipped gone.txt, a link to {corpus / 'nowhere.txt'}, which does not "
        f"exist"]  # once, though the corpus is listed again for each use
    with pytest.raises(CorpusError, match=r"gone.txt: no such file or folder, a link to .*nowhere.txt, which does"):
        Corpus(str(corpus / "parts" / "gone.txt")).check()


def _unix_socket(path):
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return s


def test_a_fifo_socket_or_device_is_one_line_naming_it(corpus):
    fifo = corpus / "c.txt"
    os.mkfifo(fifo)
    sock = _unix_socket(corpus / "s.txt")
    try:
        for spec, words in [(fifo, "a FIFO, not a file or folder"), (corpus / "s.txt", "a socket, not a file"),
                            ("/dev/null", "a character device, not a file")]:
            with pytest.raises(CorpusError, match=words) as e:
                Corpus(str(spec)).check()
            assert str(spec) in str(e.value) and "\n" not in str(e.value)
        os.mkfifo(corpus / "parts" / "f.txt")
        with pytest.raises(CorpusError, match=r"f.txt is a FIFO, not a corpus file"):
            Corpus(str(corpus / "parts")).check()
        t0 = time.monotonic()  # what the listing did not see (a FIFO put there after): the open refuses it at once
        with pytest.raises(CorpusError, match=r"c.txt: a FIFO, not a corpus file"):
            open_file(fifo)
        assert time.monotonic() - t0 < 5
    finally:
        sock.close()


@pytest.mark.usefixtures("prefect_harness")
def test_the_cli_ends_in_one_line_on_a_fifo_corpus(tmp_path):
    """The issue's case: a FIFO as the corpus path said "no such file"; nothing may block on it."""
    fifo = tmp_path / "c.txt"
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "contramine.flows.cli", "stage", "sentences", "--run", "r", "--corpus", str(fifo),
                        "--set", f"run.root={tmp_path / 'runs'}", "encoder.model=standin:encoder-32"],
                       env=_cli_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert f"corpus {fifo}: a FIFO, not a file or folder" in r.stderr, r.stderr[-2000:]


def test_an_hf_id_goes_through_the_hubs_validation_and_is_never_a_local_path(corpus, monkeypatch):
    """`hf:../corp/folder` with any 40-hex revision was read from the disk by datasets' builder, keyed by nothing of
    its content. An invalid id, or one that exists as a local path, is refused before anything is read."""
    monkeypatch.chdir(corpus)
    (corpus / "corp" / "folder").mkdir(parents=True)
    (corpus / "corp" / "folder" / "a.txt").write_text(LINES)
    for spec in ("hf:../corp/folder", "hf:/abs/path", "hf:a/b/c", "hf://datasets/../x"):
        with pytest.raises(CorpusError, match="not a hub dataset id .*local data is given as a path"):
            Corpus(spec, revision="a" * 40).check()
    for spec in ("hf:corp/folder", "hf://datasets/corp/folder", "hf:parts"):
        with pytest.raises(CorpusError, match=r"is a local path, and hf: names a hub dataset; give local data as "
                                              r"the path itself"):
            Corpus(spec, revision="a" * 40).identity()


def test_a_local_folders_identity_covers_its_content(corpus):
    """Edited in place with its size and mtime restored: the identity (the `sentences` key) still changes."""
    part = corpus / "parts" / "a.txt"
    st = part.stat()
    before = Corpus(str(corpus / "parts")).identity()
    part.write_text(LINES.replace("first", "fifth"))
    os.utime(part, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert part.stat().st_size == st.st_size and Corpus(str(corpus / "parts")).identity() != before


def test_a_link_swapped_in_between_listing_and_opening_is_refused(corpus, monkeypatch):
    """The listing checks where each part leads; the part is opened later, by its path. A link to a file outside,
    put in a part's place in between, is refused on the descriptor opened (another file than the one listed), in
    one line naming the part: none of its lines is read."""
    from contramine.pipeline.corpus import corpus as corpus_module

    parts = corpus / "parts"
    (parts / "b.txt").write_text("an honest second part of the corpus\n")
    list_parts = corpus_module.find_parts

    def list_then_swap(spec, outside_links=False):
        found = list_parts(spec, outside_links)
        (parts / "b.txt").unlink()
        (parts / "b.txt").symlink_to(corpus / "secret.txt")
        return found
    monkeypatch.setattr(corpus_module, "find_parts", list_then_swap)
    for outside_links in (False, True):  # allowed links too: only the file the listing saw is read
        with pytest.raises(CorpusError) as e:
            _every_text(Corpus(str(parts), outside_links=outside_links))
        assert "\n" not in str(e.value) and str(e.value).startswith(f"corpus {parts / 'b.txt'}: is another file "
                                                                    f"than the one listed")
        (parts / "b.txt").unlink()
        (parts / "b.txt").write_text("an honest second part of the corpus\n")


def test_an_opened_part_outside_its_root_is_refused(corpus):
    """Where the listing's identity is not at hand, the descriptor's own path (/proc/self/fd) decides."""
    from contramine.pipeline.corpus.records import Part

    (corpus / "parts" / "b.txt").symlink_to(corpus / "secret.txt")
    part = Part("b.txt", corpus / "parts" / "b.txt", "text", None, root=os.path.realpath(corpus / "parts"))
    with pytest.raises(CorpusError, match=rf"opened, it is {corpus / 'secret.txt'}, outside the corpus"):
        open_file(part)
    with open_file(Part("a.txt", corpus / "parts" / "a.txt", "text", None, root=str(corpus / "parts"))) as f:
        assert f.read() == LINES.encode()
