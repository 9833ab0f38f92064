"""The one error type of a stage that cannot go on with its input or settings, and the logging filter that keeps
the traceback of such an expected error off the terminal.

    raise StageError(f"embeddings.from {path}: row {row} has a zero or non-finite vector")

The message is one line naming the file, row, key or model. `make mine` / `make stage` (flows/cli.py) print it as
`error: <message>` and exit with code 2, whether it was raised before Prefect started or inside a shard task.

Prefect logs every failed task and flow run with its traceback ("Task run failed with exception", "Encountered
exception during execution"). The CLI points Prefect at flows/logging.yml (PREFECT_LOGGING_CONFIG_PATH, Prefect's
documented way to customise its logging), whose console handler carries `ExpectedErrors`: records of the errors the
CLI reports in one line stay off the terminal. They still reach Prefect's API handler, so the UI keeps the traceback.
This module imports nothing heavy: the filter runs in every process that logs, Dask workers included.
"""
from __future__ import annotations

import logging


class StageError(RuntimeError):
    """A stage cannot go on with this input or these settings; the message is one line naming the file, row, key
    or model (e.g. a precomputed-embeddings file without a vector for some text, an index below its recall floor)."""


# The errors the CLI prints as one line (flows/cli.py `main`), by defining module and class name, so that this
# module need not import them: a subclass of any of them counts too.
EXPECTED = frozenset({
    "pipeline.errors.StageError",
    "pipeline.sections.ConfigError",
    "pipeline.models.hub.ModelUnavailable",
    "pipeline.stages.sentences.CorpusError",
    "pipeline.engine.tables.TableMissing",
})


def is_expected(exc: BaseException | None) -> bool:
    """Whether `exc` is one of the errors the CLI reports as one line (no traceback wanted)."""
    return exc is not None and any(f"{c.__module__}.{c.__qualname__}" in EXPECTED for c in type(exc).__mro__)


class ExpectedErrors(logging.Filter):
    """Drops log records that carry an expected error (`is_expected`) with their traceback; every other record,
    unexpected errors with their tracebacks included, passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if isinstance(record.exc_info, tuple) else None
        return not is_expected(exc)
