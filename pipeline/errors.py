"""The one error type of a stage that cannot go on with its input or settings, and the logging filter that keeps
the traceback of such an expected error off the terminal.

    raise StageError(f"embeddings.from {path}: row {row} has a zero or non-finite vector")

The message is one line naming the file, row, key or model. `make mine` / `make stage` (flows/cli.py) print it as
`error: <message>` and exit with code 2, whether it was raised before Prefect started or inside a shard task.

Prefect logs every failed task and flow run with its traceback ("Task run failed with exception", "Encountered
exception during execution"). The CLI points Prefect at flows/logging.yml (PREFECT_LOGGING_CONFIG_PATH, Prefect's
documented way to customise its logging), whose console handler carries `ExpectedErrors`: records of the errors the
CLI reports in one line stay off the terminal. They still reach Prefect's API handler, so the UI keeps the traceback.
This module imports nothing heavy: the filter runs in every process that logs, Dask workers included. Every
expected error class derives from `ExpectedError`, defined here, so this module names none of them.
"""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import logging


class ExpectedError(Exception):
    """The one mark of an error the CLI reports as one line (no traceback): a bad key, file, row or model, an input
    a stage cannot use. Every such error class derives from it (ConfigError, ModelUnavailable, CorpusError,
    TableMissing, StageError, ...); the CLI and the log filter test for it and for nothing else."""


class StageError(ExpectedError, RuntimeError):
    """A stage cannot go on with this input or these settings; the message is one line naming the file, row, key
    or model (e.g. a precomputed-embeddings file without a vector for some text, an index below its recall floor)."""


def unwritable(e: BaseException, run_dir: Path | None = None) -> str | None:
    """The one line for a write the file system refused (read-only, or not this user's to write), or None for any
    other error. A read-only run folder is served by the commands that only read it (`sql`, `verify`); the others
    write below it (report/, export/, train/, the tables) and end here."""
    if not isinstance(e, OSError) or e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
        return None
    what = f"{e.strerror} writing {e.filename}" if e.filename else str(e.strerror)
    if run_dir is not None and Path(run_dir).is_dir() and not _writable(Path(run_dir)):
        return (f"run folder {run_dir} is read-only ({what}): `sql` and `verify` read it as it is; report, export, "
                f"train and the stages write into it: copy the run under a writable run.root, or make it writable")
    return (f"cannot write ({what}): a read-only folder or one this user may not write; `sql` and `verify` only "
            f"read a run, report, export, train and the stages write into it")


def _writable(folder: Path) -> bool:
    try:
        return os.access(folder, os.W_OK) and not os.statvfs(folder).f_flag & os.ST_RDONLY
    except OSError:
        return False


# What a JSON document may hold before it is parsed: Python spends ~60 bytes on an empty `{}` and ~30 on a number, so
# a 64 MiB file of `{},` or `0.5,` would take ~2 GB to parse; bounded so, any of them takes ~200 MB at most. The
# files the pipeline writes hold thousands (a manifest of 1,000 shards: ~10k values).
JSON_CONTAINERS_MAX = 1_000_000
JSON_VALUES_MAX = 4_000_000


def json_loads(raw: bytes | str):
    """json.loads of a file it did not write itself (a manifest, a sidecar, a memo record, a cache), where every
    failure is a json.JSONDecodeError (a ValueError) that its reader says in one line: invalid JSON; nesting too
    deep for the parser (100,000 `[`: never a RecursionError); more containers or values than any file of ours holds
    (counted before the parse, which would cost far more memory than the bytes); a number of more digits than
    Python converts (its own ValueError)."""
    def count(c: str) -> int:
        return raw.count(c.encode()) if isinstance(raw, bytes) else raw.count(c)

    if count("{") + count("[") > JSON_CONTAINERS_MAX or count(",") > JSON_VALUES_MAX:
        raise json.JSONDecodeError(f"more than {JSON_CONTAINERS_MAX:,} objects and lists or {JSON_VALUES_MAX:,} "
                                   f"values (no file of ours holds that many)", "", 0)
    try:
        return json.loads(raw)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to parse", "", 0) from None
    except json.JSONDecodeError:
        raise
    except ValueError as e:  # a number of more than 4,300 digits (sys.get_int_max_str_digits)
        raise json.JSONDecodeError(" ".join(str(e).split()[:8]), "", 0) from None


def printable(text: str) -> str:
    """`text` with its control characters (a corpus file named with terminal escapes) as Python writes them in a
    string, never sent raw to a terminal."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def is_expected(exc: BaseException | None) -> bool:
    """Whether `exc` is one of the errors the CLI reports as one line (no traceback wanted)."""
    return isinstance(exc, ExpectedError)


class ExpectedErrors(logging.Filter):
    """Drops log records that carry an expected error (`is_expected`) with their traceback; every other record,
    unexpected errors with their tracebacks included, passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if isinstance(record.exc_info, tuple) else None
        return not is_expected(exc)
