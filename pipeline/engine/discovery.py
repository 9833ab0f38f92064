"""Finding the stages: every module of a package in PACKAGES (below) declares one `@stage`
(spec.py); the runner and the store read the stage list from here (neither imports the other for it: no import
circle). The run order is derived from what each stage reads and writes: a topological order (each stage after the
stages that write the tables it reads), ties broken by declaration order (the packages in turn, each one's modules
by name). A table no stage writes, two writers of one table, or a circle is refused, naming the stages."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
from typing import Iterable

from contramine.pipeline.config import ConfigError
from contramine.pipeline.engine.spec import Stage
from contramine.pipeline.schema import SCHEMAS
from contramine.pipeline.storage.verify import WRITERS

# The packages of stages, by name (found without importing them): the project's own, and a plugin's appended here
PACKAGES = ["contramine.pipeline.stages"]


def stage_modules(packages: list[str] | tuple[str, ...]) -> list[str]:
    """The stage modules of `packages`, in declaration order, found without importing them (cheap: the CLI's help
    names them, and `make sql` must not import torch)."""
    found = []
    for package in packages:
        spec = importlib.util.find_spec(package)
        assert spec is not None  # the stage packages (PACKAGES) are installed with the project
        found += [f"{package}.{m.name}" for m in sorted(pkgutil.iter_modules(spec.submodule_search_locations),
                                                           key=lambda m: m.name)
                  if not m.ispkg and not m.name.startswith("_")]
    return found


def _declared(module_name: str) -> Stage:
    module = importlib.import_module(module_name)
    found = [v for v in vars(module).values() if isinstance(v, Stage) and v.module == module.__name__]
    if len(found) != 1:
        raise ImportError(f"stage module {module.__name__} declares {len(found)} stages (@stage): expected one")
    stage = found[0]
    for table in stage.writes:  # a new stage's own tables join the contract (pipeline/schema.py) here
        if table in stage.schemas:
            SCHEMAS.setdefault(table, stage.schemas[table])
        elif table not in SCHEMAS:
            raise ImportError(f"stage {stage.name} ({module.__name__}) writes `{table}` with no schema: add it "
                              f"to pipeline/schema.py or declare it with @stage(schemas=...)")
    return stage


def run_order(declared: list[Stage]) -> list[Stage]:
    """`declared` in run order: each stage after the writers of every table it reads; among the stages ready to run,
    the first declared goes first (Kahn's algorithm with a stable tie-break)."""
    writer: dict[str, Stage] = {}
    for stage in declared:
        for table in stage.writes:
            if table in writer:
                raise ImportError(f"stages {writer[table].name} and {stage.name} both write `{table}`: one table, "
                                  "one writer")
            writer[table] = stage
    needs = {}
    for stage in declared:
        for table in stage.inputs:
            if table not in writer:
                raise ImportError(f"stage {stage.name} reads `{table}`, which no stage writes")
        needs[stage.name] = {writer[t].name for t in stage.inputs} - {stage.name}
    order: list[Stage] = []
    waiting = list(declared)
    while waiting:
        done = {s.name for s in order}
        ready = next((s for s in waiting if needs[s.name] <= done), None)
        if ready is None:
            raise ImportError("stages read each other's tables in a circle: "
                              + ", ".join(f"{s.name} (reads {', '.join(sorted(needs[s.name] - done))})"
                                          for s in waiting))
        order.append(ready)
        waiting.remove(ready)
    return order


@functools.cache
def _load(modules: tuple[str, ...]) -> dict[str, Stage]:
    return {s.name: s for s in run_order([_declared(m) for m in modules])}


def load_stages() -> dict[str, Stage]:
    """Every stage, in run order (derived from reads and writes; see the module docstring)."""
    stages = _load(tuple(stage_modules(PACKAGES)))
    WRITERS.update({t: s.name for s in stages.values() for t in s.writes})  # the storage's errors name the writer
    return stages


def module_names() -> list[str]:
    """The stage modules' own names, without importing them (a built-in stage is named as its module)."""
    return [m.rsplit(".", 1)[-1] for m in stage_modules(PACKAGES)]


def writer(table: str) -> str | None:
    """The stage that writes `table`."""
    return next((s.name for s in load_stages().values() if table in s.writes), None)


def upstream(stages: dict[str, Stage]) -> dict[str, tuple[str, ...]]:
    """stage -> the stages that write what it reads (its edges in the mine's graph), in run order."""
    return {name: tuple(w for w, other in stages.items() if w != name and set(other.writes) & set(stage.inputs))
            for name, stage in stages.items()}


def stages_for(tables: Iterable[str]) -> list[str]:
    """The stages that write `tables` and every stage whose tables those read, in run order: all that a mine must
    run to have `tables` (`mine --for <objective>`: the tables that objective trains on and exports)."""
    stages = load_stages()
    writers = {t: s.name for s in stages.values() for t in s.writes}
    wanted, needed = list(tables), set()
    while wanted:
        table = wanted.pop()
        if table not in writers:
            raise ValueError(f"no stage writes table `{table}`; tables: {', '.join(writers)}")
        if writers[table] not in needed:
            needed.add(writers[table])
            wanted += stages[writers[table]].inputs
    return [name for name in stages if name in needed]


def check_stages(option: str, named: Iterable[str], running: list[str] | None = None) -> None:
    """Refuse, in one line, a stage `option` names that does not exist, or that this mine does not run (`running`,
    when it runs only some): a misspelt `--force negat` would otherwise recompute nothing, silently."""
    for name in named:
        if name not in load_stages():
            raise ConfigError(f"{option} {name!r}: no such stage; stages: {', '.join(load_stages())}")
        if running is not None and name not in running:
            raise ConfigError(f"{option} {name!r}: this mine does not run that stage (mine.for); it runs: "
                              f"{', '.join(running)}")
