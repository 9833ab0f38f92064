"""Docstrings and comments name files that exist: a reader who follows `(pipeline/storage/verify.py)` finds it.

A path-like token is `dir/name.py|toml|md|yml|json` (with a slash) or a bare `name.py`; it must match a file of the
repository by path suffix (`a/b.py`: some file whose path ends with a/b.py; `name.py`: some file of that name).
URLs, globs and placeholders (`*.py`, `<root>/a/b.py`) are not paths, nor are the files a run or a training writes."""
from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("pipeline", "trainer", "flows")  # contramine/ links to these; its own modules are read on their own
URL = re.compile(r"\S+://\S*")
# a token starts at a word (not inside a dotted name, a longer path, a URL or after a placeholder `<root>/` or a
# glob) and ends at its extension
PATH = re.compile(r"(?<![\w/.:*<>{}-])/?[\w/]+\.(?:py|toml|md|yml|json)(?![\w/*])")
# files a run or a training writes (the run folder, a checkpoint folder): named in docstrings, never in the repository
WRITTEN = ("report/index.md", "best/train_config.json", "best/results.json", "best/README.md", "1_Pooling/config.json")
SKIP_DIRS = {".git", ".venv", "__pycache__", "artifacts", "node_modules"}


def _repo_files() -> list[str]:
    out = []
    for folder, dirs, files in os.walk(ROOT):  # links are not followed: contramine/pipeline is pipeline/ again
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        rel = Path(folder).relative_to(ROOT)
        out += [(rel / f).as_posix() for f in files]
    return out


def _sources() -> list[Path]:
    files = [p for part in PARTS for p in sorted((ROOT / part).rglob("*.py"))]
    return files + sorted((ROOT / "contramine").glob("*.py"))


def _prose(source: str):
    """(line, text) of each comment and docstring of a module's source."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            text = first.value.value if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) else None
            if isinstance(text, str):
                yield first.lineno, text


def named_paths(text: str) -> list[str]:
    """The file paths a piece of prose names."""
    found = [m.group(0).lstrip("/") for m in PATH.finditer(URL.sub(" ", text))]
    return [t for t in found if ("/" in t or t.endswith(".py")) and not t.endswith(WRITTEN)]


def missing(paths: list[str], repo: list[str]) -> list[str]:
    return [t for t in paths if not any(f == t or f.endswith("/" + t) for f in repo)]


def test_docstrings_and_comments_name_files_that_exist():
    repo = _repo_files()
    stale = [f"{p.relative_to(ROOT)}:{line}: {t}" for p in _sources() for line, text in _prose(p.read_text())
             for t in missing(named_paths(text), repo)]
    assert not stale, "these name files that do not exist (moved? renamed?):\n" + "\n".join(stale)


def test_a_stale_path_is_found_and_the_rest_are_not_paths():
    repo = _repo_files()
    prose = ("""Checked against its manifest (pipeline/storage/verify.py, engine/verify.py, memo.py, verify.py); see
             https://example.org/docs/guide.md, every *.py, <root>/a/b.py, a run's report/index.md, """
             "prefect.yaml and contramine.pipeline.report")
    assert named_paths(prose) == ["pipeline/storage/verify.py", "engine/verify.py", "memo.py", "verify.py"]
    assert missing(named_paths(prose), repo) == ["engine/verify.py", "memo.py"]
