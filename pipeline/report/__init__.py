"""The mining report: one Markdown page with PNG plots that audits a finished (or partial) run.

    write_report(Path("artifacts/default"))          # -> artifacts/default/report/index.md
    headline(Path("artifacts/default"))              # a few lines: what the run mined
    python -m contramine.pipeline.report artifacts/default [--out DIR] [--seed N]

Pure (no Prefect, no model): it reads only the Parquet tables and `_manifest.json` files of the run, so it can
be rerun at any time. A table that is missing is reported as "not produced in this run" (ABSENT) rather than
failing, because offline runs legitimately skip stages (e.g. back-translation). Large tables are sampled with a seed
so the page costs seconds on a 1M-sentence run; every sample size is written on the page.

Where things live: the SQL and the numbers it yields in queries.py (`Run`, the run's tables as DuckDB views, and
the samples and aggregates), what each section says and plots in sections.py, the page, its safe writing and the
command line in page.py.
"""
from contramine.pipeline.report.page import headline, main, write_report
from contramine.pipeline.report.queries import (ABSENT, Run, overlap_by_source, overlap_stats, pool_peakedness,
                                                random_pair_cosines)

__all__ = ["ABSENT", "Run", "headline", "main", "overlap_by_source", "overlap_stats", "pool_peakedness",
           "random_pair_cosines", "write_report"]
