"""Hostile inputs and a fault-injecting CLI wrapper for tests/test_reliability.py.

Corpora are built from (bytes, line terminator, expected reason) rows, so the test knows, independently of the
code under test, how many lines a file has and where each line must end up (None = kept as a sentence).

Run as a script, this module is `python -m contramine.flows.cli` with one extra: when CONTRAMINE_PAUSE_AT is set, the process
stops at that point (writes the file named by CONTRAMINE_PAUSE_MARKER, then sleeps) so that the test can kill -9 it
exactly there. Points:
    compute:<stage>:<shard>          at the start of that shard's computation (earlier shards are finished)
    tmp:<table>:<shard>              inside Store.write_shard: Parquet bytes written to the temp file, not renamed
    sidecar:<table>:<shard>          inside Store.write_shard: Parquet file renamed into place, sidecar not written
Nothing in the product changes; the wrapper patches functions of the child process only.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIKI = ROOT.parent / "shared" / "data" / "wiki1m_head.txt"

KEPT = None  # expected reason of a line that becomes a sentence


def wiki_lines(n: int, skip: int = 0) -> list[str]:
    """n distinct real sentences of 3–60 words and at most 300 characters (the first ones of the shared corpus)."""
    out, seen = [], set()
    for line in WIKI.read_text(encoding="utf-8").splitlines():
        words = line.split()
        if 3 <= len(words) <= 60 and len(line) <= 300 and " ".join(words) not in seen:
            seen.add(" ".join(words))
            out.append(" ".join(words))
    return out[skip:skip + n]


def hostile_rows() -> list[tuple[bytes, bytes, str | None]]:
    """The kitchen-sink corpus: 44 real sentences interleaved with every hostile line, mixed line endings."""
    wiki = wiki_lines(44)
    long_ok = " ".join(f"{'w' * 17}{i:02d}" for i in range(100))  # 100 words, 1999 characters: just inside
    assert len(long_ok) == 1999
    hostile: list[tuple[bytes, str | None]] = [
        (b"", "empty"),
        (b"   \t    ", "empty"),                                          # whitespace only
        ("\u00a0\u2003\u3000".encode(), "empty"),                         # Unicode spaces only
        (b"\x00\x01\x07\x1b\x7f", "empty"),                               # control characters only
        (("lorem ipsum " * 4200)[:50_000].encode(), "too_long"),          # 50,000 characters, 8,334 words
        (b"x" * 50_000, "too_long"),                                      # one 50,000-character word
        (long_ok.encode(), KEPT),                                         # 1,999 characters: kept, encoder truncates
        (" ".join(["word"] * 129).encode(), "too_long"),                  # 129 words > max_words
        (" ".join(f"t{i}" for i in range(128)).encode(), KEPT),           # 128 words: kept
        (b"The\x00quick\tbrown\x1bfox jumps\x7f over the lazy dog", KEPT),  # control characters inside
        (b"a line with form\x0cfeed and vertical\x0btab inside", KEPT),   # not line breaks for the corpus
        ("next line\u0085and line\u2028and paragraph\u2029separators".encode(), KEPT),  # one line, not four
        ("a byte order mark \ufeff in the middle".encode(), KEPT),
        (b"caf\xe9 au lait is good here", "undecodable"),                  # Latin-1 byte
        (b"an emoji cut short \xf0\x9f\x98", "undecodable"),              # truncated UTF-8 sequence
        (b"\xed\xa0\x80 an encoded surrogate half", "undecodable"),       # surrogates are not UTF-8
        (b"\xff\xfe\x00 stray bytes", "undecodable"),
        ("القطة تجلس على الحصيرة في البيت".encode(), KEPT),               # Arabic, right to left
        ("\u200fהחתול יושב על השטיח\u200e בבית".encode(), KEPT),           # Hebrew with direction marks
        ("😀 🎉 🚀".encode(), KEPT),                                       # emoji only, three words
        ("👨‍👩‍👧 a family of three with 🏳️‍🌈".encode(), KEPT),               # ZWJ sequences
        ("Cafe\u0301 is open today".encode(), KEPT),                      # decomposed é ...
        ("Café is open today".encode(), "duplicate"),                     # ... equals the composed one after NFC
        (("  " + wiki[3] + " \t ").encode(), "duplicate"),                # whitespace variant of a real line
        (wiki[5].encode(), "duplicate"),                                  # exact duplicate
        (b"two words", "too_short"),
    ]
    rows: list[tuple[bytes, str | None]] = []
    # a BOM before the first real line: dropped, the line is kept as written
    rows.append((b"\xef\xbb\xbf" + wiki[0].encode(), KEPT))
    h = iter(hostile)
    for i, line in enumerate(wiki[1:], start=1):
        rows.append((line.encode(), KEPT))
        if i % 2 == 0 and (nxt := next(h, None)) is not None:
            rows.append(nxt)
    rows.extend(h)
    endings = [b"\n", b"\r\n", b"\r", b"\n"]
    out = [(text, endings[i % len(endings)], reason) for i, (text, reason) in enumerate(rows)]
    for i in range(1, len(out)):  # "\r" then an empty line's "\n" would read as one "\r\n" break
        if out[i][0] == b"" and out[i - 1][1] == b"\r":
            out[i - 1] = (out[i - 1][0], b"\n", out[i - 1][2])
    out[-1] = (out[-1][0], b"", out[-1][2])  # the last line has no terminator
    assert out[-1][0], "an empty last line without a terminator is no line at all"
    return out


def write_corpus(path: Path, rows: list[tuple[bytes, bytes, str | None]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(text + end for text, end, _ in rows))
    return path


def plain_rows(lines: list[str]) -> list[tuple[bytes, bytes, str | None]]:
    return [(line.encode(), b"\n", None) for line in lines]


# ---- links planted in a run folder ----

KEY32 = "0123456789abcdef" * 2
VICTIM_FILES = {  # names the project writes somewhere, so a write, rename or delete through a link would hit them
    "notes.txt": b"precious\n",
    "_manifest.json": b'{"not": "yours"}\n',
    ".lock": b"their lock\n",
    "part-00000-of-00001.parquet": b"not a shard\n",
    "part-00000-of-00001.0123456789abcdef.json": b"{}\n",
    f"hnsw-{KEY32}.json": b"{}\n",
    f"sids-{KEY32}.npy": b"ids\n",
    "index.md": b"# theirs\n",
    "stage_seconds.png": b"not a png\n",
    "metrics.jsonl": b'{"step": 1}\n',
    "events.out.tfevents.1.victim": b"events\n",
    "sentences/README.md": b"their card\n",
    "sentences/data/train-x-00000-of-00001.parquet": b"their rows\n",
    "last/state.pt": b"their state\n",
}


def victim_folder(where: Path) -> Path:
    """A folder outside every run holding files under the names contramine writes (VICTIM_FILES)."""
    for name, data in VICTIM_FILES.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_bytes(data)
    return where


def tree(folder: Path) -> dict[str, bytes | str]:
    """Everything below `folder` by relative name: a file's bytes, a link's target, a folder's mode; links are not
    followed. Equal before and after = not a byte or a name changed."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(folder))
            out[rel] = f"-> {os.readlink(p)}" if p.is_symlink() else (f"dir {p.stat().st_mode:o}" if p.is_dir()
                                                                      else p.read_bytes())
    return out


def plant(link: Path, target: Path) -> Path:
    """`link` -> `target`, creating the folders above the link."""
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=target.is_dir())
    return link


def one_line(err: str) -> str:
    """The last line of a command's stderr, which has no traceback."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    return lines[-1]


def run_with_a_table(run: Path) -> Path:
    """One table and its manifest: the report draws the stage-seconds plot, the `sentences` export has rows."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from contramine.pipeline.schema import SCHEMAS

    d = run / "sentences"
    d.mkdir(parents=True)
    rows = [{"sid": i, "text": f"sentence number {i}", "n_words": 3, "line_no": i} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMAS["sentences"]), d / "part-00000-of-00001.parquet")
    (d / "_manifest.json").write_text(json.dumps({"stage": "sentences", "seconds": 1.5, "rows": {"sentences": 5},
                                                  "config": {}, "table": "sentences", "shards": 1}))
    return run


# ---- the fault-injecting CLI ----

def _pause(point: str) -> None:
    marker = os.environ.get("CONTRAMINE_PAUSE_MARKER")
    if marker:
        Path(marker).write_text(f"{os.getpid()} {point}")
    while True:  # until kill -9
        time.sleep(60)


def install_pause(at: str) -> None:
    import dataclasses

    from contramine.pipeline.storage import store
    from contramine.pipeline.engine.runner import load_stages

    kind, what, shard = at.split(":")
    shard = int(shard)
    if kind == "compute":
        stages = load_stages()
        inner = stages[what].compute

        def compute(ctx):
            if ctx.i == shard:
                _pause(at)
            return inner(ctx)

        stages[what] = dataclasses.replace(stages[what], compute=compute)
    elif kind == "tmp":
        write_table = store.pq.write_table
        prefix = f".part-{shard:05d}-of-"

        def patched_write_table(data, where, *a, **kw):
            write_table(data, where, *a, **kw)
            p = Path(os.path.realpath(str(where)))  # atomic_file's temp path goes through /proc/self/fd/<folder>
            if p.parent.name == what and p.name.startswith(prefix) and p.name.endswith(".tmp"):
                _pause(at)

        store.pq.write_table = patched_write_table
    elif kind == "sidecar":
        write_json = store.atomic_write_json
        name = f"part-{shard:05d}-of-"

        def patched_write_json(path, obj, *a, **kw):
            p = Path(path)
            if p.parent.name == what and p.name.startswith(name) and p.suffix == ".json":
                _pause(at)
            return write_json(path, obj, *a, **kw)

        store.atomic_write_json = patched_write_json
    else:
        raise SystemExit(f"CONTRAMINE_PAUSE_AT {at!r}: expected compute:|tmp:|sidecar:<name>:<shard>")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if os.environ.get("CONTRAMINE_PAUSE_AT"):
        install_pause(os.environ["CONTRAMINE_PAUSE_AT"])
    from contramine.flows.cli import main

    sys.exit(main())
