"""A sentence's identity: its normalised text and the sid derived from it. Below both the stages and the models
(the `sentences` stage assigns sids with these; a precomputed-vectors file is matched by them)."""
from __future__ import annotations

import hashlib
import unicodedata


def sentence_id(text: str) -> int:
    """The first 8 bytes of blake2b(text) as a signed int64: stable across runs, machines and shard counts."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little", signed=True)


_CONTROL = {c: " " for c in [*range(0x20), *range(0x7F, 0xA0)]}
_CONTROL.update({0x2028: " ", 0x2029: " ", 0xFEFF: " "})


def normalise(text: str) -> str:
    """Control characters → space, NFC, whitespace runs → one space, stripped."""
    return " ".join(unicodedata.normalize("NFC", text.translate(_CONTROL)).split())


def unicode_facts() -> str:
    """What normalise's output depends on beyond its code: Python's Unicode tables (NFC, what str.split calls
    whitespace). A stage whose bytes normalise shapes puts this in its facts (its cache key), so a Python whose
    tables differ recomputes those shards. Read at call time: a test may patch it."""
    return f"unicodedata={unicodedata.unidata_version}"
