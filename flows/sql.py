"""DuckDB over a run: every finished table of artifacts/<run>/ is a view with the table's name. Imports neither
torch nor Prefect, so `make sql Q=...` answers in about a second."""
from __future__ import annotations

import sys
from pathlib import Path

import duckdb

from contramine.pipeline.storage.served import changed_since_checked, with_paths
from contramine.pipeline.storage.tables import RunTables


def connect(run_dir: Path) -> duckdb.DuckDBPyConnection:
    """DuckDB with every finished table of the run as a view (RunTables: each table's current layout only)."""
    return RunTables(run_dir).connect()


def open_run(run_dir: Path) -> tuple[duckdb.DuckDBPyConnection, dict[str, str]]:
    """`connect`, and the one line of each table it could not serve ({table: line}: a manifest of the wrong shape,
    a listed file missing), left for the caller to say once."""
    tables = RunTables(run_dir)
    con = tables.connect(say=False)
    return con, tables.refused


def query_error(e: duckdb.Error, refused: dict[str, str]) -> str:
    """A failed query in one line: the refusal of the table it names when it names one without a view."""
    text = " ".join(str(e).splitlines())
    for table, line in refused.items():
        if isinstance(e, duckdb.CatalogException) and table in text:
            return line
    return f"sql: {text}"


def changed_line(con: duckdb.DuckDBPyConnection, rehash: bool = True) -> str | None:
    """One line when a file the connection's views read has changed since it was checked (a rewrite in place by
    whoever may write it: DuckDB reads the files again at every query), else None (served.changed_since_checked)."""
    path = changed_since_checked(con, rehash)
    return None if path is None else (f"sql: {path} changed since it was checked when this connection opened: its "
                                      f"answer is not served; run `sql` again (it checks the files anew)")


def run_query(con: duckdb.DuckDBPyConnection, query: str, refused: dict[str, str], max_rows: int) -> str | None:
    """Run and show one query; None, or the one line that says why it was not answered (or, where a file changed
    while it ran, why its answer above is not to be trusted)."""
    if (line := changed_line(con)) is not None:
        return line
    try:
        rel = con.sql(query)
        if rel is not None:
            rel.show(max_rows=max_rows, max_width=200)
    except duckdb.Error as e:
        return with_paths(con, query_error(e, refused))  # the shard's own path, not /proc/self/fd/N
    return changed_line(con, rehash=False)  # any change while it ran: its answer is not the checked bytes


def repl(con: duckdb.DuckDBPyConnection, run_dir: Path, refused: dict[str, str] | None = None) -> None:
    views = [r[0] for r in con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1").fetchall()]
    print(f"DuckDB over {run_dir}: views {', '.join(views)}. End a query with ';', quit with Ctrl-D or .quit")
    buf = ""
    while True:
        try:
            line = input("sql> " if not buf else "...> ")
        except EOFError:
            print()
            return
        if line.strip() in (".quit", ".exit", "\\q"):
            return
        buf += line + "\n"
        if buf.strip().endswith(";"):
            if (why := run_query(con, buf, refused or {}, 40)) is not None:
                print(f"error: {why}", file=sys.stderr)
            buf = ""
