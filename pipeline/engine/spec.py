"""What a stage declares next to its computation; the runner (runner.py) reads nothing else.

    @stage(reads=("embeddings",), reads_whole=("embeddings", "pool_embeddings"), writes=("neighbours",),
           settings=("neighbours",), resources=(INDEX,), manifest=index_facts)
    def neighbours(ctx: Ctx) -> dict[str, pa.Table]:
        ...

- reads:        tables of which the stage reads shard i while computing its shard i (per-sentence tables);
- reads_whole:  tables it reads whole (every shard), e.g. the search base of `neighbours`;
- writes:       the tables it writes, one shard each per shard index;
- settings:     the config sections that change its result (their content hash is part of the cache key; a
                section's execution settings, its `EXECUTION` set, are left out);
- resources:    the models and indexes it uses (resources.py), declared next to their models: resolved once per
                run before any shard starts — fingerprint, device, precision, engine, index kind — and that plan
                is part of the cache key and the manifest; a shard reads the plan as `ctx.plan[name]` and the
                loaded object as `ctx.resource(name)` (loaded as the plan says, keyed by the settings it read);
- facts:        cfg -> str, whatever else changes the result: input files, resolved models, device, precision,
                library versions (part of the cache key, recorded in the manifest);
- manifest:     (cfg, store, n, plan) -> dict, facts the manifest records beyond rows and hashes;
- schemas:      {table: pa.Schema} for tables that pipeline/schema.py does not list (a new stage's own tables);
- checks:       cfg -> None | (notes, plan): fail fast before any work (a missing corpus, model or spaCy
                pipeline: one line); what the CLI's preflight runs for the stages it will run, each distinct check
                once; a check may return plain-words notes and resources it resolved (the run keeps that plan);
- one_job:      one job writes every shard (`sentences` reads the corpus in one pass; its compute returns
                {table: [shard 0, shard 1, ...]}).
- memos:        the row memos its per-row model work goes through (pipeline/memo/rows.py): `Memo(name, facts)`, facts =
                (cfg, plan) -> what shapes a row besides its own input and the stage's code version; a shard gets
                one as `ctx.memo(name)`, and the manifest records each one's namespace and rows computed / reused.

The stage's name is the function's name; its code version covers its module and every pipeline module that module
imports (codeversion.py), so it cannot go stale by hand. A stage module imports no other stage module: what two
stages share lives below them (pipeline/models/, pipeline/roles.py, pipeline/identity.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Callable

from contramine.pipeline.engine.resources import Resource, acquire
from contramine.pipeline.memo.run import open_memo

if TYPE_CHECKING:  # (not imports of the stages: the code version does not follow them)
    import pyarrow as pa

    from contramine.pipeline.config import Config
    from contramine.pipeline.storage.store import Store


@dataclass
class Ctx:
    """What a shard computation sees: the config, its shard index, readers for its inputs, the run's resolved
    resources (`plan`), whether to show progress."""
    cfg: "Config"
    store: "Store"
    i: int
    n: int
    progress: bool = False
    stage: "Stage | None" = None
    plan: dict = field(default_factory=dict)
    memos: dict = field(default_factory=dict)
    force: bool = False  # --force: the row memos read nothing (every row to the model again)

    def memo(self, name: str):
        """The stage's declared row memo `name` for this run (pipeline/memo/run.py): `.rows(keys, compute, schema)`."""
        if name not in self.memos:
            declared = {m.name: m for m in (self.stage.memos if self.stage else ())}
            if name not in declared:
                raise KeyError(f"stage {self.stage.name if self.stage else '?'} uses memo {name!r} without "
                               f"declaring it (@stage(memos=...))")
            self.memos[name] = open_memo(self.stage, declared[name], self.cfg, self.plan, self.force)
        return self.memos[name]

    def resource(self, name: str):
        """The loaded resource `name` of this stage, for the run's plan (loaded once per process)."""
        declared = {r.name: r for r in (self.stage.resources if self.stage else ())}
        if name not in declared:
            raise KeyError(f"stage {self.stage.name if self.stage else '?'} uses resource {name!r} without "
                           f"declaring it (@stage(resources=...))")
        assert self.stage is not None  # declared: there is a stage
        return acquire(self.stage.name, declared[name], self.cfg, self.store, self.n, self.plan[name])

    def shard(self, table: str, columns: tuple[str, ...] | None = None, dictionary: tuple[str, ...] = ()) -> "pa.Table":
        """This job's shard of `table`; only `columns` (those the file has) when given; `dictionary`: string
        columns read as dictionary columns."""
        return self.store.read_shard(table, self.i, self.n, columns, dictionary)

    def whole(self, table: str) -> "pa.Table":
        return self.store.read(table, self.n)

    def label(self, what: str) -> str | bool:
        """A progress-bar label for this shard, or False when progress is off."""
        return self.progress and f"{what} {self.i + 1}/{self.n}"


@dataclass(frozen=True)
class Memo:
    """A row memo a stage declares: `facts(cfg, plan) -> dict` is what shapes a row besides the row's own input
    and the stage's code version (the settings it reads, its resources' plan, the seed where a model samples)."""
    name: str
    facts: Callable[["Config", dict], dict] = field(compare=False)


@dataclass(frozen=True)
class Stage:
    name: str
    compute: Callable[[Ctx], dict]
    module: str
    writes: tuple[str, ...]
    reads: tuple[str, ...] = ()
    reads_whole: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()
    facts: Callable[["Config"], str] | None = field(default=None, compare=False)
    manifest: Callable[["Config", "Store", int, dict], dict] | None = field(default=None, compare=False)
    one_job: bool = False
    schemas: dict = field(default_factory=dict, compare=False)
    resources: tuple["Resource", ...] = ()
    checks: tuple[Callable, ...] = field(default=(), compare=False)
    memos: tuple[Memo, ...] = ()

    @property
    def inputs(self) -> tuple[str, ...]:
        return (*self.reads, *self.reads_whole)

    def __call__(self, ctx: Ctx) -> dict:
        return self.compute(ctx)


def package_versions(*packages: str) -> str:
    """"name=version,..." of installed distributions ("-" when absent): library versions change results too."""
    def v(p: str) -> str:
        try:
            return version(p)
        except PackageNotFoundError:
            return "-"
    return ",".join(f"{p}={v(p)}" for p in packages)


def stage(*, writes: tuple[str, ...], reads: tuple[str, ...] = (), reads_whole: tuple[str, ...] = (),
          settings: tuple[str, ...] = (), facts=None, manifest=None, one_job: bool = False,
          schemas: dict | None = None, resources: tuple = (), checks: tuple = (), memos: tuple = ()):
    """Declare the decorated function `name(ctx) -> {table: pa.Table}` as the stage `name` (see the module doc)."""
    def declare(fn) -> Stage:
        return Stage(fn.__name__, fn, fn.__module__, tuple(writes), tuple(reads), tuple(reads_whole),
                     tuple(settings), facts, manifest, one_job, dict(schemas or {}),
                     tuple(resources), tuple(checks), tuple(memos))
    return declare
