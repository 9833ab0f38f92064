"""A stage's code version: the hash of its module and of every pipeline module it imports, transitively.

Derived from the source (ast), never listed by hand: editing `seeding.py` invalidates exactly the stages that draw
per-row random numbers, editing the encoder's padding-free forward exactly the stages that embed. Imports under
`if TYPE_CHECKING:` are not followed (they run nothing), and neither are imports of the engine (ENGINE: the runner,
declarations, resources, the store and the row memo): it moves data and decides nothing a table holds, and a shard's
content hash is checked on every reuse; nor, through it, the stage list. What a resource resolves that changes
bytes (a model's files, an engine module's own code version) is in the resource's plan, which is in the key.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import threading
from importlib.util import resolve_name
from pathlib import Path

PIPELINE = Path(__file__).resolve().parent
PACKAGE = "contramine.pipeline"  # PIPELINE's import name
FORMAT = "contramine-2"


def module_file(module: str, root: Path = PIPELINE) -> Path | None:
    """contramine.pipeline.a.b -> <root>/a/b.py (or <root>/a/b/__init__.py); None for modules outside the package."""
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        return None
    base = root.joinpath(*module.removeprefix(PACKAGE).lstrip(".").split(".")) if module != PACKAGE else root
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


_PARSE = threading.Lock()


def imported_modules(source: str, module: str) -> set[str]:
    """Absolute names of what `module`'s source imports, anywhere in it (function-level imports too)."""
    package = module if module.endswith("__init__") else module.rpartition(".")[0]
    package = package.removesuffix(".__init__")
    out: set[str] = set()
    skip: set[int] = set()
    with _PARSE:  # CPython 3.11.7's ast.parse is not safe in concurrent threads ("AST constructor recursion depth
        tree = ast.parse(source)  # mismatch", seen with shard threads computing code versions at once)
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            skip.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            base = resolve_name("." * node.level + (node.module or ""), package) if node.level else node.module or ""
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from pipeline import seeding`
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


# not followed (module doc): the engine, and the run folder's storage and row memo that were its files
ENGINE = ("contramine.pipeline.engine", "contramine.pipeline.storage", "contramine.pipeline.memo")
# not followed either: modules a resource's plan chooses and records the code version of (the translation engines)
PLANNED = ("contramine.pipeline.models.translate.engines",)


def module_closure(roots: tuple[str, ...], root: Path = PIPELINE) -> list[str]:
    """`roots` and every pipeline module they import, transitively (sorted by name), the engine's left out."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        m = todo.pop()
        path = module_file(m, root)
        if m in seen or path is None or (m in ENGINE + PLANNED or m.startswith(tuple(e + "." for e in ENGINE + PLANNED))) and m not in roots:
            continue
        seen.add(m)
        name = m + ".__init__" if path.name == "__init__.py" else m
        todo += sorted(imported_modules(path.read_text(), name) - seen)
    return sorted(seen)


@functools.cache
def code_version(module: str, root: Path = PIPELINE) -> str:
    """Hash of the source of `module` and of every pipeline module it imports."""
    h = hashlib.blake2b(FORMAT.encode(), digest_size=16)
    for m in module_closure((module,), root):
        h.update(m.encode() + b"\0" + module_file(m, root).read_bytes())  # type: ignore[union-attr]  # has a file
    return h.hexdigest()
