"""The names a table folder holds: its manifest, its shards (part-<i>-of-<n>.<key16>.parquet: shard_file), and the
names its writers make (shards, sidecars, their temp files). Here apart so that the modules the store calls
(grace.py) need not import the store."""
from __future__ import annotations

import hashlib
import re

# fullmatch, and \Z not $: a name ending in a newline is not a part (pipeline/config/names.py does the same)
PART = re.compile(r"part-(\d{5})-of-(\d{5})(?:\.([0-9a-f]{16}))?\.parquet\Z")
OLD_PART = re.compile(r"part-(\d{5})-of-(\d{5})\.parquet\Z")  # a manifest without a file list names these
MANIFEST = "_manifest.json"
# what a writer of a table folder makes there besides the manifest: shards, their sidecars and their temp files
_SHARD = r"part-\d{5}-of-\d{5}(?:\.[0-9a-f]{16})?\.(?:parquet|json)"
OWN = re.compile(rf"{_SHARD}|\.{_SHARD}\.[a-z0-9_]+\.tmp")


def shard_file(i: int, n: int, key: str | None = None) -> str:
    """Shard i of n written under `key` (16 hex digits of its hash in the name; the sidecar holds the whole key);
    without a key, the name a manifest without a file list means."""
    if key is None:
        return f"part-{i:05d}-of-{n:05d}.parquet"
    return f"part-{i:05d}-of-{n:05d}.{hashlib.blake2b(key.encode(), digest_size=8).hexdigest()}.parquet"
