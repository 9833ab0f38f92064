"""contramine: mine training data for unsupervised contrastive sentence embeddings, and train on it.

    import contramine
    run = contramine.open_run("default")                     # a mined run under ./artifacts (or root=...)
    run.sql("SELECT count(*) FROM triplets").fetchall()      # a DuckDB relation over the run's tables
    run.table("sentences")                                   # a pyarrow.Table
    contramine.mine(corpus="my_corpus.txt", run="mine1")     # `contramine mine` from a notebook
    from contramine.losses import DebCSELoss                 # the sentence-transformers losses

The project's parts are `contramine.pipeline` (stages, models, the run folder), `contramine.trainer` and
`contramine.flows` (Prefect flows and the CLI). Importing `contramine` imports none of them.
"""
from __future__ import annotations

from pathlib import Path

# The parts are this package's subpackages: contramine/pipeline, contramine/trainer and contramine/flows are committed
# links to the repository's top-level folders, so a checkout, an editable install and the wheel all load each file as
# one module, `contramine.<part>.<...>`, and tools that read code (IDEs, type checkers) see the same names.


class Run:
    """A mined run's tables: `.sql(query)` -> a DuckDB relation (every table a view), `.table(name)` -> Arrow."""

    def __init__(self, folder: Path):
        from contramine.flows.sql import connect
        from contramine.pipeline.storage.tables import RunTables

        self.folder = folder
        self.tables = RunTables(folder)
        self.connection = connect(folder)

    def sql(self, query: str):
        """A DuckDB relation (`.fetchall()`, `.df()`, `.arrow()`) of `query` over the run's tables, its rows read now,
        between two looks at the files (DuckDB would read them again whenever the relation runs): a file changed
        since it was checked (rewritten in place) is one line here, as `contramine sql` says it."""
        from contramine.flows.sql import changed_line
        from contramine.pipeline.errors import ExpectedError

        if (line := changed_line(self.connection)) is not None:
            raise ExpectedError(line)
        rel = self.connection.sql(query)
        rows = rel.to_arrow_table() if rel is not None else None
        if (line := changed_line(self.connection, rehash=False)) is not None:
            raise ExpectedError(line)
        return self.connection.from_arrow(rows) if rows is not None else None

    def table(self, name: str):
        """The table `name` (e.g. "triplets") as one pyarrow.Table."""
        return self.tables.read(name)

    def __repr__(self) -> str:
        return f"Run({str(self.folder)!r})"


def open_run(name: str, root: str | Path | None = None) -> Run:
    """The run `name` under `root` (default: where `contramine mine` puts runs: ./artifacts, a checkout's artifacts/).
    A missing run is a one-line error naming the folder."""
    from contramine.pipeline.config import ARTIFACTS
    from contramine.pipeline.errors import ExpectedError

    folder = (Path(root) if root is not None else ARTIFACTS) / name
    if not folder.is_dir():
        raise ExpectedError(f"no run {name!r}: {folder} is not a folder (mine it with `contramine mine --run {name}`)")
    return Run(folder)


def mine(profile: str = "default", run: str | None = None, corpus: str | None = None,
         overrides: list[str] | None = None, **kwargs) -> dict:
    """`contramine mine` from Python (a notebook): mines `corpus` with `profile` into the run `run`, returns the rows
    each stage wrote. `overrides` are `--set` settings ("neighbours.k=8"); other keywords go to the mine flow."""
    from contramine.flows.mine import mine_flow

    return mine_flow(profile=profile, run=run, corpus=corpus, overrides=list(overrides or []), **kwargs)


__all__ = ["Run", "open_run", "mine"]
