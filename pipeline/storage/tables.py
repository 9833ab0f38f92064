"""Reading a run's tables: the one reader for the SQL views, the mining report, the trainer and the tests.

    tables = RunTables("artifacts/default")
    tables.names()                       # tables the run has finished (each has a _manifest.json)
    tables.read("pairs", ["anchor"])     # an Arrow table, rows in sid order
    tables.connect()                     # DuckDB with every finished table as a view

A table is the file list its manifest names (store.py): shards a rerun wrote and did not commit are never read; the
previous computation is served whole until the next commit. Readers take no lock. A commit keeps the files the
previous manifest named for runner.keep_replaced_s (grace.py); a read that finds a file gone reads the new manifest
once more. Every listed file is checked against the hash its manifest records before it is served (verify.py): a
damaged one is one line naming it and the stage run that rewrites it. What is served is read from the very
descriptors that were checked (served.py): by pyarrow (`read`, `dataset`), and by DuckDB through /proc/self/fd paths
of descriptors each connection holds until it goes (its own TEMP views). Imports neither torch nor Prefect, and
discovers no stage (a missing table's error names its writer: that path alone looks the stages up).

Folder names become SQL view names only when they are plain identifiers (`[A-Za-z0-9_]+`), and are quoted. A
manifest is data too: its shape is checked (manifest.py: check_manifest) before anything it names is read, and a
wrong one is one line naming the table, its run and the `make stage ... FORCE=1` that rewrites it (TableUnreadable).
"""
from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from contramine.pipeline.storage.atomic import atomic_dir, recover
from contramine.pipeline.storage.lock import run_lock
from contramine.pipeline.storage.safe_paths import UnsafePath, read_regular
from contramine.pipeline.storage.manifest import MANIFEST, MANIFEST_MAX, TableCorrupt, committed_files, parse_manifest, read_manifest
from contramine.pipeline.storage.verify import WRITERS, Verified, damaged_line, table_line
from contramine.pipeline.storage.reuse_files import NotBrought, link_or_copy as _link_or_copy, owned_here
from contramine.pipeline.storage.served import close_all, dataset_of, fd_path, hold_for, read_checked, room_for
from contramine.pipeline.errors import ExpectedError
from contramine.pipeline.hints import command, via_make, no_such_run
from contramine.pipeline.schema import SCHEMAS

VIEW_NAME = re.compile(r"[A-Za-z0-9_]+")  # fullmatch  # a folder name that may become a SQL view name (then quoted)
log = logging.getLogger("contramine.tables")
_said: set[tuple[str, str]] = set()  # (run folder, name) already named in this process: once, not per reader


def _say_once(run_dir: Path, name: str, line: str) -> None:
    if (str(run_dir), name) not in _said:
        _said.add((str(run_dir), name))
        log.warning(line)


class TableMissing(ExpectedError, FileNotFoundError):
    """A table the caller needs is not in the run; the message is one line saying which stage writes it."""


class TableUnreadable(ExpectedError, ValueError):
    """A committed table whose files are not all there (or not plain files): one line naming it and the fix."""


def writer_of(table: str) -> str:
    """The stage that writes `table`, as the stages loaded in this process declare it (verify.WRITERS: the storage
    sits below the stages and never imports them); the table's own name where none is loaded."""

    return WRITERS.get(table) or table


class RunTables:
    def __init__(self, run_dir: Path | str):
        self.dir = Path(run_dir)
        self._verified: Verified | None = None  # the run's remembered shard checks, loaded at the first read

    def manifest(self, table: str) -> dict | None:
        try:
            return read_manifest(self.dir / table)
        except TableCorrupt as e:
            raise TableUnreadable(str(e)) from None

    def names(self) -> list[str]:
        """Finished tables: the contract's in schema order, then any other (a stage added by a user). A folder whose
        name is not a plain identifier is left out, and named once (it cannot be a view, and no stage writes it)."""
        if not self.dir.is_dir():
            return []
        have = set()
        for p in self.dir.glob(f"*/{MANIFEST}"):
            name = p.parent.name
            if name.startswith("."):
                continue
            if not VIEW_NAME.fullmatch(name) or p.parent.is_symlink():
                _say_once(self.dir, name, f"{self.dir}: folder {name!r} left out (a table's name is letters, digits "
                                          f"and '_', and a table is a folder, not a link)")
                continue
            have.add(name)
        return [t for t in SCHEMAS if t in have] + sorted(have - set(SCHEMAS))

    def exists(self, table: str) -> bool:
        return (self.dir / table / MANIFEST).is_file()

    def shards(self, table: str) -> int:
        files = self._committed(table)
        if files is None:
            raise TableMissing(table)  # (files() says more)
        return len(files)

    def committed_rows(self, table: str) -> int:
        """The rows the table's last commit lists (its manifest's file entries: the files are not opened)."""
        return sum(e["rows"] for e in self._committed(table) or [])

    def _committed(self, table: str) -> list[dict] | None:
        try:
            return committed_files(self.dir / table)
        except TableCorrupt as e:
            raise TableUnreadable(str(e)) from None

    def _listed(self, table: str, keep: bool = False) -> tuple[list[Path], list[int], list[tuple[str, str]]]:
        """(the paths the last commit lists, with `keep` their checked descriptors (open: the caller serves from
        them and closes them), [(name, why)] of those missing, not plain files, or whose bytes do not hash to what
        the commit records: verify.py). A listed file gone at its check (a commit removed it after its grace)
        reads the new manifest once more."""
        if self._verified is None:
            self._verified = Verified(self.dir)
        found = self._check_each(table, self._verified, keep)
        if any(why == "is missing" for _, why in found[2]):
            found = self._check_each(table, self._verified, keep)
        return found

    def _check_each(self, table: str, verified: Verified, keep: bool
                    ) -> tuple[list[Path], list[int], list[tuple[str, str]]]:
        paths, fds, bad = [], [], []  # type: tuple[list[Path], list[int], list[tuple[str, str]]]
        try:
            for e in self._committed(table) or []:
                path = self.dir / table / e["file"]
                paths.append(path)
                fd, why = verified.open_checked(table, path, e.get("hash"), e.get("bytes"))
                if fd is None:
                    bad.append((path.name, why or "cannot be read"))
                elif keep:
                    fds.append(fd)
                else:
                    close_all([fd])
        except BaseException:
            close_all(fds)
            raise
        verified.save()
        if bad:  # nothing of the table is served: no descriptor kept
            close_all(fds)
            fds = []
        return paths, fds, bad

    def _refuse(self, table: str, paths: list[Path], bad: list[tuple[str, str]]) -> None:
        if not paths:
            raise self.missing(table)
        if bad:
            more = f" ({len(bad) - 1} more shard(s) of it too)" if len(bad) > 1 else ""
            raise TableUnreadable(damaged_line(self.dir / table, bad[0][0], bad[0][1] + more))

    def files(self, table: str) -> list[Path]:
        """The files the table's last commit lists, in shard (= sid) order, each checked against the hash the commit
        records; TableMissing (one line naming the stage that writes it) when the run has not got it,
        TableUnreadable (one line naming the shard and the command that rewrites it) when a listed file is gone,
        a link or damaged."""
        paths, _, bad = self._listed(table)
        self._refuse(table, paths, bad)
        return paths

    def held(self, table: str) -> tuple[list[Path], list[int]]:
        """`files`, and each file's checked descriptor, open: the caller reads from those and closes them."""
        paths, fds, bad = self._listed(table, keep=True)
        self._refuse(table, paths, bad)
        return paths, fds

    def files_if_any(self, table: str) -> list[Path]:
        """Like `files`, but [] for a table the run does not have or cannot serve whole (no error, no stage lookup)."""
        try:
            paths, _, bad = self._listed(table)
        except TableUnreadable:
            return []
        return [] if bad else paths

    def missing(self, table: str) -> TableMissing:
        tdir, run = self.dir / table, self.dir.name
        what = "no such folder" if not tdir.is_dir() else "no finished shards in it"
        # the writer discovery passed down where the stages are loaded; else the contract's tables (sql loads none)
        writer = WRITERS.get(table)
        if writer is None and (WRITERS or table not in SCHEMAS):  # a folder no stage writes: no stage run brings it
            return TableMissing(f"table {table!r} at {tdir}/ ({what}): no stage writes `{table}`, so no stage run "
                                f"brings it; it is a folder of the run that is no mined table (remove it, or ask "
                                f"for a table a stage writes)")
        by = (f"the `{writer}` stage — run `{command('mine', run=run)}` (every stage) or "
              f"`{command('stage', stage=writer, run=run)}` (that stage and what it reads must exist)" if writer
              else f"a mining stage — run `{command('mine', run=run)}`")
        return TableMissing(f"mined table {table!r} not found at {tdir}/ ({what}): it is written by {by}")

    def dataset(self, table: str) -> pads.Dataset:
        """The table's checked files as a pyarrow dataset that reads the files that were checked, for as long as
        it lives (served.py), and verifies each Parquet page's checksum; in memory where the process may not hold
        that many files open."""
        if not room_for(2 * len(self._committed(table) or [])):  # our descriptors, and pyarrow's own of the same files
            return pads.dataset(self._in_memory(table))
        _, fds = self.held(table)
        try:
            return dataset_of(fds)
        finally:
            close_all(fds)

    def _in_memory(self, table: str) -> pa.Table:
        """The table read shard by shard, each from its checked descriptor, one open at a time."""
        self.files(table)  # every shard checked first: a damaged one is the line files() says
        parts, verified = [], self._verified or Verified(self.dir)
        for e in self._committed(table) or []:
            path = self.dir / table / e["file"]
            fd, why = verified.open_checked(table, path, e.get("hash"), e.get("bytes"))
            if fd is None:  # changed since files() checked it
                raise TableUnreadable(damaged_line(self.dir / table, path.name, why or "changed"))
            try:
                parts.append(read_checked(fd))
            finally:
                close_all([fd])
        return pa.concat_tables(parts)

    def read(self, table: str, columns: list[str] | None = None) -> pa.Table:
        try:
            return self.dataset(table).to_table(columns=columns)
        except TableMissing:  # its own line says which stage writes it; there is nothing to remove
            raise
        except (pa.ArrowInvalid, OSError) as e:  # not what Parquet readers read (a page checksum)
            raise TableUnreadable(table_line(self.dir / table, f"cannot be read ({' '.join(str(e).split())[:160]})")) from None

    def sql_source(self, table: str, con) -> str:
        """A DuckDB expression for the table in `con`: its checked files through /proc/self/fd paths of descriptors
        held as long as `con` lives (without /proc, the paths); or, where the process may not hold that many open,
        read into memory from its checked descriptors and registered. `emb` back to FLOAT[d]."""
        if room_for(len(self._committed(table) or [])):
            paths, fds = self.held(table)
            hold_for(con, fds, paths, [e.get("hash") for e in self._committed(table) or []])
            named = [fd_path(fd, p) for p, fd in zip(paths, fds)]
            source = "read_parquet([" + ", ".join("'" + f.replace("'", "''") + "'" for f in named) + "])"
            emb = pq.read_schema(named[0]).field("emb").type if table == "embeddings" else None
        else:
            data = self._in_memory(table)
            con.register(f"_served_{table}", data)  # the connection keeps the Arrow table
            source, emb = f'"_served_{table}"', data.schema.field("emb").type if table == "embeddings" else None
        if emb is not None:  # Parquet has no fixed-size list: restore FLOAT[d]
            d = emb.list_size if pa.types.is_fixed_size_list(emb) else None
            if d is None:
                d = con.execute(f"SELECT max(len(emb)) FROM {source}").fetchall()[0][0] or 1
            source = f"(SELECT sid, emb::FLOAT[{d}] AS emb FROM {source})"
        return source

    def connect(self, con=None, say: bool = True):
        """A DuckDB connection with every finished table of the run as a view named after it, over the files
        checked now, held open until the connection goes (sql_source). A table that cannot be served whole (a
        manifest of the wrong shape, a listed file missing) gets no view: its one line is in `self.refused`
        ({table: line}) and, with `say`, in the log once."""
        import duckdb  # duckdb: only the SQL views need it; stages and the trainer read with pyarrow

        if not self.dir.is_dir():
            raise FileNotFoundError(no_such_run(self.dir))
        con = con or duckdb.connect()
        self.refused: dict[str, str] = {}
        for table in self.names():  # names(): plain identifiers only, and quoted all the same
            try:
                source = self.sql_source(table, con)
            except ExpectedError as e:
                self.refused[table] = " ".join(str(e).splitlines())
                if say:
                    _say_once(self.dir, table, self.refused[table])
                continue
            con.execute(f'CREATE TEMP VIEW "{table}" AS SELECT * FROM {source}')
        return con


COPY_TRIES = 3  # readings of a source table's manifest before a copy that keeps losing files gives up


def reuse_tables(src: Path | str, dst: Path | str) -> list[str]:
    """Start run folder `dst` from run `src`'s finished tables, the ones `dst` has not got: hard links where the
    file system allows (every write of the pipeline replaces a file, never edits it, so the runs never share a
    change), else copies; each table lands whole or not at all (atomic_dir). Nothing is trusted because it was
    copied: a stage reuses a shard only when its key (settings, inputs, code, models) matches, so what another
    encoder, say, decides is computed again. Returns the tables it brought.

    Each table is copied from ONE reading of its manifest: the bytes read are the manifest the copy gets, and
    exactly the files they list are linked. A file that vanished meanwhile (the source run committed that table
    again) starts the table over from the new manifest, COPY_TRIES times at most, then a one-line refusal; a
    table never lands as a manifest without its files."""
    source, dst = RunTables(src), Path(dst)
    if source.dir.resolve() == dst.resolve():
        raise TableMissing(f"--reuse-from: {source.dir} is this run's own folder: name the run to start from")
    if not source.names():
        raise TableMissing(f"--reuse-from: {source.dir}/ holds no finished table (no */_manifest.json): mine that run "
                           f"first, or name another")
    if (owner := source.dir.stat().st_uid) != os.getuid() and os.getuid() != 0:  # its manifests vouch for it
        raise TableUnreadable(f"--reuse-from: {source.dir} is another account's (uid {owner}): only runs of your own "
                              f"are brought (a run's manifests vouch for its shards); copy it once you trust it")

    with run_lock(dst, "--reuse-from"):  # it writes into dst: as any writer, alone
        return _bring(source, dst)


def _only_a_manifest(table_dir: Path) -> bool:
    """A table folder holding a manifest and no shard (what an interrupted copy of older code could leave): not a
    table of the run's own, so a copy may replace it."""
    try:
        names = [p.name for p in table_dir.iterdir()]
    except OSError:
        return False
    return MANIFEST in names and not any(n.startswith("part-") for n in names)


def _bring(source: RunTables, dst: Path) -> list[str]:
    brought = []
    for table in source.names():
        own = recover(dst / table, root=dst)
        if own.exists() and not (own.is_dir() and not own.is_symlink() and _only_a_manifest(own)):
            continue  # the run's own: never replaced
        with atomic_dir(dst / table, root=dst) as tmp:  # the commit, the files it lists and their sidecars: plain files only
            _copy_table(source, table, tmp)
        brought.append(table)
    return brought


def reuse_command(source: str) -> str:
    """`make mine FROM=<source>` under make, `contramine mine --reuse-from <source>` elsewhere."""
    return f"make mine FROM={source}" if via_make() else f"contramine mine --reuse-from {source}"


class _Vanished(Exception):
    """A file the manifest read lists was gone when it was linked: the source committed meanwhile."""


def _copy_table(source: RunTables, table: str, tmp: Path) -> None:
    """Fill `tmp` with one snapshot of the source table: its manifest's bytes as read once, and every file those
    list. Starts over (from a new reading) when a listed file vanished; TableUnreadable after COPY_TRIES."""
    src_dir = source.dir / table
    for attempt in range(COPY_TRIES):
        for p in list(tmp.iterdir()):  # what an attempt before this one linked
            _remove_entry(p)
        try:
            raw = read_regular(src_dir / MANIFEST, follow=True, max_size=MANIFEST_MAX)  # a FIFO: one line, no hang
        except UnsafePath as e:
            raise TableUnreadable(f"--reuse-from: table `{table}` of {source.dir}/: {e}") from None
        except FileNotFoundError:
            raise TableUnreadable(f"--reuse-from: table `{table}` of {source.dir}/ lost its manifest while it was "
                                  f"copied (a stage of that run is writing it): run again when it has finished"
                                  ) from None
        files = committed_files(src_dir, _parse(src_dir, raw))
        try:
            _link_listed(source, table, files, tmp)  # type: ignore[arg-type]  # a manifest given: a list
        except _Vanished:
            continue
        (tmp / MANIFEST).write_bytes(raw)  # the manifest that lists exactly what was linked
        return
    raise TableUnreadable(f"--reuse-from: table `{table}` of {source.dir}/ was committed again {COPY_TRIES} times "
                          f"while it was copied (a stage of that run is running): run `{reuse_command(source.dir.name)}` again "
                          f"when it has finished; nothing of `{table}` was brought")


def _parse(src_dir: Path, raw: bytes) -> dict:
    try:
        return parse_manifest(src_dir, raw)
    except TableCorrupt as e:
        raise TableUnreadable(f"--reuse-from: {e}") from None


def _link_listed(source: RunTables, table: str, files: list[dict], tmp: Path) -> None:
    src_dir = source.dir / table
    for e in files:
        shard = src_dir / e["file"]
        if shard.is_symlink():
            raise TableUnreadable(f"--reuse-from: {shard} is a symbolic link, not a shard file: the source table is "
                                  f"not copied (rewrite it with "
                                  f"`{command('stage', stage=writer_of(table), run=source.dir.name, force=True)}`)")
        for path, expected in ((shard, e.get("hash")), (shard.with_suffix(".json"), None)):
            if path != shard and not (path.is_file() and not path.is_symlink()):
                continue  # the sidecar: optional (a shard reuse needs it, a read does not)
            try:  # checked against the source's manifest, read once: the bytes it lists, no link
                _link_or_copy(path, tmp / path.name, expected)
            except FileNotFoundError:
                raise _Vanished(path) from None
            except NotBrought as why:
                raise TableUnreadable(f"--reuse-from: {path} {why}: the source table is not copied") from None
    index = src_dir / "_index"  # the neighbours stage's built index, keyed by what it was built from: a cache
    if index.is_dir() and owned_here(source.dir, src_dir, index):  # FAISS loads it: never another's (reuse_files)
        (tmp / "_index").mkdir()
        for p in index.iterdir():
            if p.is_file() and owned_here(p):
                try:
                    _link_or_copy(p, tmp / "_index" / p.name)
                except (FileNotFoundError, NotBrought):
                    pass  # rebuilt meanwhile, or a link swapped in: the stage builds it again where it needs to


def _remove_entry(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink()
