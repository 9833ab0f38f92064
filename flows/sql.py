"""DuckDB over a run: every finished table of artifacts/<run>/ is a view with the table's name. Imports neither
torch nor Prefect, so `make sql Q=...` answers in about a second."""
from __future__ import annotations

import sys
from pathlib import Path

import duckdb

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
            try:
                rel = con.sql(buf)
                if rel is not None:
                    rel.show(max_rows=40, max_width=200)
            except duckdb.Error as e:
                print(f"error: {query_error(e, refused or {})}", file=sys.stderr)
            buf = ""
