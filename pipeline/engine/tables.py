"""Reading a run's tables: the one reader for the SQL views, the mining report, the trainer and the tests.

    tables = RunTables("artifacts/default")
    tables.names()                       # tables the run has finished (each has a _manifest.json)
    tables.read("pairs", ["anchor"])     # an Arrow table, rows in sid order
    tables.connect()                     # DuckDB with every finished table as a view

A table's layout comes from its manifest (`shards`): only `part-*-of-<n>` files of that layout are read, so shards
of an older layout that an interrupted re-shard left behind are never read twice. Imports neither torch nor Prefect.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads

from pipeline.engine.store import schema_of
from pipeline.errors import ExpectedError
from pipeline.schema import SCHEMAS

PART = re.compile(r"^part-(\d{5})-of-(\d{5})\.parquet$")


class TableMissing(ExpectedError, FileNotFoundError):
    """A table the caller needs is not in the run; the message is one line saying which stage writes it."""


def writer_of(table: str) -> str:
    """The stage that writes `table` (imports the stage modules: used on the error path only)."""
    from pipeline.engine.discovery import writer

    return writer(table) or table


class RunTables:
    def __init__(self, run_dir: Path | str):
        self.dir = Path(run_dir)

    def manifest(self, table: str) -> dict | None:
        p = self.dir / table / "_manifest.json"
        return json.loads(p.read_text()) if p.is_file() else None

    def names(self) -> list[str]:
        """Finished tables: the contract's in schema order, then any other (a stage added by a user)."""
        if not self.dir.is_dir():
            return []
        have = {p.parent.name for p in self.dir.glob("*/_manifest.json") if not p.parent.name.startswith(".")}
        return [t for t in SCHEMAS if t in have] + sorted(have - set(SCHEMAS))

    def exists(self, table: str) -> bool:
        return (self.dir / table / "_manifest.json").is_file()

    def shards(self, table: str) -> int:
        man = self.manifest(table)
        if man and "shards" in man:
            return int(man["shards"])
        layouts = {int(m.group(2)) for p in (self.dir / table).glob("part-*.parquet") if (m := PART.match(p.name))}
        if len(layouts) != 1:
            raise TableMissing(table)  # (files() says more)
        return layouts.pop()

    def files(self, table: str) -> list[Path]:
        """The part files of the table's current layout, in shard (= sid) order; TableMissing (one line naming
        the stage that writes it) when the run has not got it."""
        files = self.files_if_any(table)
        if not files:
            raise self.missing(table)
        return files

    def files_if_any(self, table: str) -> list[Path]:
        """Like `files`, but [] for a table the run does not have (no error, no stage lookup)."""
        try:
            n = self.shards(table)
        except TableMissing:
            return []
        files = [self.dir / table / f"part-{i:05d}-of-{n:05d}.parquet" for i in range(n)]
        return files if all(f.is_file() for f in files) else []

    def missing(self, table: str) -> TableMissing:
        tdir, run = self.dir / table, self.dir.name
        what = "no such folder" if not tdir.is_dir() else "no finished shards in it"
        writer = writer_of(table)
        return TableMissing(f"mined table {table!r} not found at {tdir}/ ({what}): it is written by the `{writer}` "
                            f"stage — run `make mine RUN={run}` (every stage) or `make stage STAGE={writer} RUN={run}` "
                            f"(that stage and what it reads must exist)")

    def dataset(self, table: str) -> pads.Dataset:
        return pads.dataset([str(f) for f in self.files(table)], format="parquet")

    def read(self, table: str, columns: list[str] | None = None) -> pa.Table:
        files = self.files(table)
        if not files:
            return schema.empty_table() if (schema := schema_of(table)) is not None else pa.table({})
        return self.dataset(table).to_table(columns=columns)

    def sql_source(self, table: str) -> str:
        """A DuckDB expression for the table: its current layout's files; `emb` back to FLOAT[d]."""
        files = ", ".join("'" + str(f).replace("'", "''") + "'" for f in self.files(table))
        source = f"read_parquet([{files}])"
        if table == "embeddings":  # Parquet has no fixed-size list: restore FLOAT[d]
            dim = self.dataset(table).schema.field("emb").type
            d = dim.list_size if pa.types.is_fixed_size_list(dim) else None
            if d is None:
                import duckdb

                d = duckdb.sql(f"SELECT max(len(emb)) FROM {source}").fetchall()[0][0] or 1
            source = f"(SELECT sid, emb::FLOAT[{d}] AS emb FROM {source})"
        return source

    def connect(self, con=None):
        """A DuckDB connection with every finished table of the run as a view named after it."""
        import duckdb

        if not self.dir.is_dir():
            raise FileNotFoundError(f"{self.dir}: no such run (make mine first)")
        con = con or duckdb.connect()
        for table in self.names():
            if self.files_if_any(table):
                con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM {self.sql_source(table)}')
            elif (schema := schema_of(table)) is not None:  # finished with zero shards: empty, not absent
                con.register(table, schema.empty_table())
        return con


def reuse_tables(src: Path | str, dst: Path | str) -> list[str]:
    """Start run folder `dst` from run `src`'s finished tables, the ones `dst` has not got: hard links where the
    file system allows (every write of the pipeline replaces a file, never edits it, so the runs never share a
    change), else copies; each table lands whole or not at all (atomic_dir). Nothing is trusted because it was
    copied: a stage reuses a shard only when its key (settings, inputs, code, models) matches, so what another
    encoder, say, decides is computed again. Returns the tables it brought."""
    import os
    import shutil

    from pipeline.engine.atomic import atomic_dir, recover

    source, dst = RunTables(src), Path(dst)
    if source.dir.resolve() == dst.resolve():
        raise TableMissing(f"--reuse-from: {source.dir} is this run's own folder: name the run to start from")
    if not source.names():
        raise TableMissing(f"--reuse-from: {source.dir}/ holds no finished table (no */_manifest.json): mine that run "
                           f"first, or name another")

    def link_or_copy(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:  # another file system, or one without hard links
            shutil.copy2(a, b)

    brought = []
    for table in source.names():
        if recover(dst / table).exists():
            continue  # the run's own: never replaced
        with atomic_dir(dst / table) as tmp:
            shutil.copytree(source.dir / table, tmp, dirs_exist_ok=True, copy_function=link_or_copy)
        brought.append(table)
    return brought
