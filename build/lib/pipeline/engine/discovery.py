"""Finding the stages: every module of `pipeline/stages/__init__.py: ORDER` declares one `@stage` (spec.py); the
runner and the store read the stage list from here (neither imports the other for it: no import circle). A stage
may read only tables that a stage before it in ORDER writes: discovery refuses any other order, naming both."""
from __future__ import annotations

import functools
import importlib

from pipeline.engine.spec import Stage
from pipeline.schema import SCHEMAS


@functools.cache
def _load(order: tuple[str, ...]) -> dict[str, Stage]:
    stages: dict[str, Stage] = {}
    for entry in order:
        module = importlib.import_module(entry if "." in entry else f"pipeline.stages.{entry}")
        found = [v for v in vars(module).values() if isinstance(v, Stage) and v.module == module.__name__]
        if len(found) != 1:
            raise ImportError(f"stage module {module.__name__} declares {len(found)} stages (@stage): expected one")
        stage = found[0]
        written = {t: s.name for s in stages.values() for t in s.writes}
        for table in stage.inputs:  # ORDER runs a stage after the stages whose tables it reads
            if table not in written:
                later = next((e for e in order[order.index(entry) + 1:] if table in _writes_of(e)), None)
                raise ImportError(f"stage {stage.name} reads `{table}`, which no stage before it in ORDER writes"
                                  + (f" (stage module {later} writes it later: move it before {stage.name})"
                                     if later else ""))
        for table in stage.writes:  # a new stage's own tables join the contract (pipeline/schema.py) here
            if table in stage.schemas:
                SCHEMAS.setdefault(table, stage.schemas[table])
            elif table not in SCHEMAS:
                raise ImportError(f"stage {stage.name} ({module.__name__}) writes `{table}` with no schema: add it "
                                  f"to pipeline/schema.py or declare it with @stage(schemas=...)")
        stages[stage.name] = stage
    return stages


def _writes_of(entry: str) -> tuple[str, ...]:
    """The tables the stage module of an ORDER entry writes (for the error message only)."""
    module = importlib.import_module(entry if "." in entry else f"pipeline.stages.{entry}")
    return next((v.writes for v in vars(module).values() if isinstance(v, Stage)), ())


def load_stages() -> dict[str, Stage]:
    """Every stage, in run order (pipeline/stages/__init__.py: ORDER)."""
    from pipeline import stages

    return _load(tuple(stages.ORDER))


def writer(table: str) -> str | None:
    """The stage that writes `table`."""
    return next((s.name for s in load_stages().values() if table in s.writes), None)
