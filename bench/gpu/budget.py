"""The GPU check's clock (issue 63): a lease is 15 minutes of device time in all, start-up included, and one call at
most 10, so the check has a deadline of its own and every row a time budget.

- The deadline (`deadline_s`, seconds from the check's start: bench/gpu/check.py's SIZES): a row that finds less
  time left than it needs is one row "not run" (`not_run`: true, no value) and takes no time; a section the
  deadline reaches before it starts is one row `<section>_not_run`.
- A row's budget (`row_s`, or ROW_S's own for the rows known to take longer): past it the row is one failed row
  ("timed out after N s") and the next row runs. Both are a SIGALRM timer (`signal.setitimer`) whose handler raises
  OutOfTime, a BaseException, so that no library's `except Exception` swallows it; it lands when the main thread
  next runs Python code (a CUDA kernel in flight finishes first).
- Every row goes to `emit` as it is measured (check.py writes results.json at once), so a run killed from outside
  (the lease's end) leaves what it measured.
- `skip`: the rows an earlier run measured (`--rerun-failed`): `guarded` returns nothing for them and the earlier
  row stays in the results.
Outside the check (tests, benches that call a section's helpers) the clock has no deadline and no timer.
"""
from __future__ import annotations

import math
import signal
import threading
import time
from contextlib import contextmanager

# Row budgets that differ from `row_s` (seconds on a GPU; the twin multiplies every budget by TWIN_SLACK): the
# compiled rows compile every batch shape first; HF generate at batch 64 is the check's slowest measured row.
ROW_S = {"generate_static_compile_tokens_per_s": 150.0, "generate_user_hf_tokens_per_s": 120.0}


DEADLINE = "the check's deadline"  # OutOfTime.what when the deadline, not a row's budget, ran out


OPTIONAL = frozenset({"compiled"})  # sections whose rows may go unmeasured for time without failing the check


class OutOfTime(BaseException):
    """A row's budget or the check's deadline ran out (not an Exception: library code must not catch it)."""

    def __init__(self, what: str, seconds: float):
        super().__init__(what)
        self.what, self.seconds = what, seconds


class Clock:
    def __init__(self, deadline_s: float = math.inf, row_s: float = math.inf, scale: float = 1.0,
                 start: float | None = None, skip: frozenset[str] = frozenset(), emit=None):
        self.start = time.perf_counter() if start is None else start
        self.deadline_s, self.row_s, self.scale, self.skip, self.emit = deadline_s, row_s, scale, skip, emit
        self._row: str | None = None  # the row whose budget the timer holds now

    def left(self) -> float:
        """Seconds left before the deadline."""
        return self.deadline_s - (time.perf_counter() - self.start)

    def budget(self, name: str) -> float:
        return ROW_S.get(name, self.row_s) * self.scale

    def _arm(self, seconds: float, what: str) -> None:
        if threading.current_thread() is not threading.main_thread() or not math.isfinite(seconds):
            return
        signal.signal(signal.SIGALRM, lambda *_: self._fire(what, seconds))
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))

    def _fire(self, what: str, seconds: float) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        raise OutOfTime(what, seconds)  # from the main thread's next Python line

    def disarm(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.setitimer(signal.ITIMER_REAL, 0)

    @contextmanager
    def deadline(self):
        """The check's deadline over a section's own work (what it does between rows: models, vectors)."""
        self._arm(self.left(), DEADLINE)
        try:
            yield
        finally:
            self.disarm()

    @contextmanager
    def row(self, name: str):
        """The row's budget, cut to the deadline (`guarded` calls `resume` after it has written the row down)."""
        if self._row is not None:  # a row inside a row: the outer budget holds
            yield
            return
        budget, left = self.budget(name), self.left()
        self._row = name
        self._arm(min(budget, left), f"timed out after {budget:.3g} s (the row's budget)" if budget <= left
                  else DEADLINE)
        try:
            yield
        finally:
            self._row = None
            self.disarm()

    def resume(self) -> None:
        """The deadline's timer again, where one is set (between rows, inside a section)."""
        if self._row is None and math.isfinite(self.left()):
            self._arm(self.left(), DEADLINE)


CLOCK = Clock()  # the check sets its own (bench/gpu/check.py main); tests and benches get no deadline


def use(clock: Clock) -> Clock:
    """`clock` from now on, the timer of the one before it stopped."""
    global CLOCK
    CLOCK.disarm()
    CLOCK = clock
    return clock


def clock() -> Clock:
    return CLOCK


def settled(previous: dict, strict: bool, optional: frozenset[str],
            only: tuple[str, ...] | None = None) -> tuple[list[dict], set[str]]:
    """From an earlier results.json: (its rows a rerun keeps, the sections it need not run). A row needs a rerun
    when it failed, did not run, or (strict) was skipped for a missing package; a section when it did not finish
    or any of its rows needs a rerun. A section outside `only` (the rerun's --only) keeps every row, failed or
    not. Summary rows are always made again."""
    rows = [r for r in previous.get("rows", []) if r.get("section") != "summary"]
    bad = set(failures(rows, strict, optional)) | {r["name"] for r in rows if r.get("not_run")}
    kept = [r for r in rows if r["name"] not in bad or (only is not None and r.get("section") not in only)]
    broken = {r.get("section") for r in rows if r["name"] in bad}
    return kept, set(previous.get("sections_done", [])) - broken


def failures(rows: list[dict], strict: bool, optional: frozenset[str] = OPTIONAL) -> list[str]:
    """The rows that fail the check: a false equality check, a row that failed or timed out, a section that stopped
    with an error, a row or section the deadline left unrun (not in an `optional` section), and, when strict, a
    section skipped for a missing package (`<section>_skipped`)."""
    return [r["name"] for r in rows
            if r["ok"] is False or (strict and r["name"].endswith("_skipped"))
            or (r.get("not_run") and r.get("section") not in optional)]


def merged(kept: list[dict], new: list[dict]) -> list[dict]:
    """The earlier good rows with the rerun's rows: a rerun row replaces the earlier one of its name in place."""
    fresh = {r["name"]: r for r in new}
    out = [fresh.pop(r["name"], r) for r in kept]
    return out + [r for r in new if r["name"] in fresh]
