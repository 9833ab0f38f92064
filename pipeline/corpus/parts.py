"""Which files a local corpus spec names, in reading order: a single file, every file of the corpus forms under a
folder (sorted by relative path; names starting with `.` or `_` skipped: .crc, _SUCCESS), or what a glob matches
(`**` crosses folders), in the same order.

A corpus is what is inside it. A file of a folder or glob whose real path (links resolved) lies outside the corpus
root (the folder; the glob's fixed head) is refused in one line naming the link and where it leads, unless
`data.outside_links` allows it: a received dataset carrying a link to ~/.aws/credentials must not put its lines into
tables that exports share. A dangling link is skipped with a warning line naming it. A FIFO, socket or device, as the
corpus or inside it, is one line naming it (never opened). Each part keeps what the listing saw (its device and
inode, the root it must lie in): streams.open_file checks the descriptor it opens against both, so a link swapped in
between the listing and the opening is refused in one line.
"""
from __future__ import annotations

import glob
import logging
import os
import re
import stat
from pathlib import Path

from contramine.pipeline.corpus.forms import form_of, names
from contramine.pipeline.errors import printable
from contramine.pipeline.corpus.records import CorpusError, Part
from contramine.pipeline.corpus.streams import kind_of

log = logging.getLogger("contramine.corpus")
_WARNED: set[tuple[str, str]] = set()


def _skipped(relative: str) -> bool:
    return any(p.startswith((".", "_")) for p in relative.split("/"))


def _inside(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _parts_below(base: Path, paths: list[Path], what: str, outside_links: bool) -> list[Part]:
    root, parts = os.path.realpath(base), []
    for path in sorted(paths, key=lambda p: p.relative_to(base).as_posix()):
        name = path.relative_to(base).as_posix()
        if _skipped(name):
            continue
        try:
            st = os.stat(path)
            mode = st.st_mode
        except FileNotFoundError:
            if os.path.islink(path):  # a dangling link: nothing to read, but never silently (once a process: a
                if (what, name) not in _WARNED:  # run lists its corpus for the check, the key and the reading)
                    _WARNED.add((what, name))
                    log.warning("corpus %s: skipped %s, a link to %s, which does not exist", printable(what),
                                printable(name), printable(os.readlink(path)))
                continue
            raise CorpusError(f"corpus {what}: {path} vanished while the corpus was listed") from None
        except OSError as e:  # a link to itself (ELOOP), a folder it may not read: one line naming it
            raise CorpusError(f"corpus {what}: {name}: cannot read it ({e.strerror})") from None
        if stat.S_ISDIR(mode):
            continue  # a glob matched a folder: its files are matched on their own
        try:
            real = os.path.realpath(path)
        except OSError as e:  # swapped between a link and a file as it was resolved (readlink's EINVAL)
            raise CorpusError(f"corpus {what}: {name} changed while the corpus was listed ({e.strerror})") from None
        if not _inside(real, root) and not outside_links:
            raise CorpusError(f"corpus {what}: {name} leads outside the corpus (to {real}); remove the link, or set "
                              f"data.outside_links=true to read it")
        if not stat.S_ISREG(mode):
            raise CorpusError(f"corpus {what}: {name} is {kind_of(mode)}, not a corpus file")
        kind = form_of(path, alone=False)
        if kind is None:
            raise CorpusError(f"corpus {what}: {path} is none of the corpus forms ({names()}): a glob can leave it "
                              f"out")
        parts.append(Part(name, path, *kind, listed=(st.st_dev, st.st_ino), root=None if outside_links else root))
    if not parts:
        raise CorpusError(f"corpus {what}: no corpus files ({names()}) found")
    return parts


def _folder_reached_twice(base: Path) -> Path | None:
    """The first folder below `base` that following links reaches a second time (a loop, or two ways in), or None:
    what `**` would walk, each folder once."""
    seen, todo = set(), [str(base)]
    while todo:
        folder = todo.pop()
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in seen:
                return Path(folder)
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(folder) as entries:
                todo += [e.path for e in entries if e.is_dir(follow_symlinks=True) and not e.name.startswith(".")]
        except OSError:
            continue  # unreadable or gone: glob skips it too
    return None


def find_parts(spec: str, outside_links: bool = False) -> list[Part]:
    """The files of a local corpus, in reading order."""
    if any(c in spec for c in "*?["):
        head = re.split(r"[*?\[]", spec, maxsplit=1)[0]
        base = Path(head if head.endswith(os.sep) else os.path.dirname(head) or ".")
        if "**" in spec and (again := _folder_reached_twice(base)) is not None:  # `**` follows links to
            raise CorpusError(f"corpus glob {spec}: {again} is a folder reached twice through links (a link to a "  # folders:
                              f"folder above it never ends): remove the link, or name the parts")  # a loop never ends
        found = [Path(p) for p in glob.glob(spec, recursive=True)]
        return _parts_below(base, found, f"glob {spec}", outside_links)
    path = Path(spec)
    try:
        st = os.stat(path)
        mode = st.st_mode
    except FileNotFoundError:
        gone = f", a link to {os.readlink(path)}, which does not exist" if os.path.islink(path) else ""
        raise CorpusError(f"corpus {spec}: no such file or folder{gone}") from None
    except OSError as e:
        raise CorpusError(f"corpus {spec}: cannot read it ({e.strerror})") from None
    if stat.S_ISDIR(mode):
        found = [Path(d) / f for d, _, files in os.walk(path) for f in files]
        return _parts_below(path, found, f"folder {path}", outside_links)
    if not stat.S_ISREG(mode):
        raise CorpusError(f"corpus {spec}: {kind_of(mode)}, not a file or folder of the corpus forms")
    return [Part(path.name, path, *form_of(path, alone=True), listed=(st.st_dev, st.st_ino))]
