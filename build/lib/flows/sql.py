"""DuckDB over a run: every finished table of artifacts/<run>/ is a view with the table's name. Imports neither
torch nor Prefect, so `make sql Q=...` answers in about a second."""
from __future__ import annotations

import sys
from pathlib import Path

import duckdb

from pipeline.engine.tables import RunTables


def connect(run_dir: Path) -> duckdb.DuckDBPyConnection:
    """DuckDB with every finished table of the run as a view (RunTables: each table's current layout only)."""
    return RunTables(run_dir).connect()


def repl(con: duckdb.DuckDBPyConnection, run_dir: Path) -> None:
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
                print(f"error: {e}", file=sys.stderr)
            buf = ""
