"""DuckDB over a run: every finished table of artifacts/<run>/ is a view with the table's name."""
from __future__ import annotations

import sys
from pathlib import Path

import duckdb

from pipeline.store import Store


def connect(run_dir: Path) -> duckdb.DuckDBPyConnection:
    store, con = Store(run_dir), duckdb.connect()
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run (make mine first)")
    for table_dir in sorted(p for p in Path(run_dir).iterdir() if p.is_dir() and not p.name.startswith(".")):
        if store.exists(table_dir.name):
            n = store.shard_count(table_dir.name)
            glob = str(table_dir / f"part-*-of-{n:05d}.parquet").replace("'", "''")
            source = f"read_parquet('{glob}')"
            if table_dir.name == "embeddings":  # Parquet has no fixed-size list: restore FLOAT[d]
                d = con.sql(f"SELECT max(len(emb)) FROM {source}").fetchall()[0][0] or 1
                source = f"(SELECT sid, emb::FLOAT[{d}] AS emb FROM {source})"
            con.execute(f"CREATE VIEW \"{table_dir.name}\" AS SELECT * FROM {source}")
    return con


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
