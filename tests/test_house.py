"""The shape of the house: a stage is one module that declares itself (no runner edit to add one), prefect.yaml is
generated from the stage list, `sql` and `report` import neither torch nor Prefect, no Python file over 400 lines."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from contramine.flows.deployments import render
from contramine.pipeline.engine import discovery, runner
from contramine.pipeline.engine.runner import load_stages
from contramine.pipeline.storage.tables import RunTables
from contramine.pipeline.schema import SCHEMAS

ROOT = Path(__file__).resolve().parent.parent

TOY_STAGE = '''
"""A toy stage: the number of characters of each sentence."""
import pyarrow as pa
import pyarrow.compute as pc

from contramine.pipeline.engine.spec import Ctx, stage

LENGTHS = pa.schema([("sid", pa.int64()), ("n_chars", pa.int32())])


@stage(reads=("sentences",), writes=("sentence_lengths",), schemas={"sentence_lengths": LENGTHS})
def sentence_lengths(ctx: Ctx) -> dict[str, pa.Table]:
    s = ctx.shard("sentences")
    n_chars = pc.utf8_length(s.column("text")).cast(pa.int32())
    return {"sentence_lengths": pa.table({"sid": s.column("sid"), "n_chars": n_chars}, schema=LENGTHS)}
'''


@pytest.fixture
def toy_stage(tmp_path, monkeypatch):
    """One new module in a package of stages (here a plugin package beside the project's, appended to PACKAGES):
    nothing else changes; its place in the run order follows from what it reads."""
    package = tmp_path / "toystages"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "lengths.py").write_text(textwrap.dedent(TOY_STAGE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(discovery, "PACKAGES", [*discovery.PACKAGES, "toystages"])
    yield "sentence_lengths"
    SCHEMAS.pop("sentence_lengths", None)


def test_a_toy_stage_is_one_module_and_no_runner_edit(toy_stage, small_corpus, tmp_path, prefect_harness):
    from contramine.flows.mine import mine_flow
    from contramine.flows.sql import connect

    assert toy_stage in load_stages() and toy_stage not in Path(runner.__file__).read_text()
    # 24 lines (a rejected empty and short line among them) and the stand-in encoder: the point is the toy stage's
    # place in a whole mine, not the models' work
    corpus = tmp_path / "c24.txt"
    corpus.write_text("".join(small_corpus.read_text(encoding="utf-8").splitlines(keepends=True)[:24]),
                      encoding="utf-8")
    sets = ["encoder.model=standin:encoder-32", "neighbours.pool_size=8", "noise.n_variants=2", "run.shards=2",
            "backtranslate.chains=[]", f"run.root={tmp_path}"]
    rows = mine_flow(profile="default", run="toy", corpus=str(corpus), overrides=sets)
    run = RunTables(tmp_path / "toy")
    sentences, lengths = run.read("sentences"), run.read(toy_stage)
    assert rows[toy_stage] == {toy_stage: sentences.num_rows} and sentences.num_rows > 0
    assert lengths.column("sid").equals(sentences.column("sid"))
    assert lengths.column("n_chars").to_pylist() == [len(t) for t in sentences.column("text").to_pylist()]
    got = connect(tmp_path / "toy").sql("SELECT count(*) FROM sentence_lengths l JOIN sentences USING (sid)")
    assert got.fetchall()[0][0] == sentences.num_rows  # a view in `make sql` like every other table
    again = mine_flow(profile="default", run="toy", corpus=str(corpus), overrides=sets)
    assert again == rows and run.manifest(toy_stage)["shards_cached"] == 2  # cached like every other stage
    assert f"flows/mine.py:{toy_stage}_flow" in render(load_stages())  # and a deployment of its own


def test_a_stage_table_without_a_schema_is_refused(tmp_path, monkeypatch):
    package = tmp_path / "badstages"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nameless.py").write_text(textwrap.dedent(TOY_STAGE).replace(
        ', schemas={"sentence_lengths": LENGTHS}', "").replace("sentence_lengths", "nameless_table"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(discovery, "PACKAGES", [*discovery.PACKAGES, "badstages"])
    with pytest.raises(ImportError, match="writes `nameless_table` with no schema"):
        load_stages()


def test_prefect_yaml_is_generated_from_the_stage_list():
    """`python -m contramine.flows.deployments > prefect.yaml` after adding a stage; this says when someone forgot."""
    assert (ROOT / "prefect.yaml").read_text() == render(load_stages()), \
        "prefect.yaml is stale: run `.venv/bin/python -m contramine.flows.deployments > prefect.yaml`"


@pytest.mark.parametrize("command", ["sql", "report"])
def test_sql_and_report_import_neither_torch_nor_prefect(command, tmp_path):
    """What makes `make sql Q=...` answer in about a second: the command imports what it uses."""
    probe = textwrap.dedent(f"""
        import sys
        from contramine.flows.cli import main
        main(["{command}", "--run", "empty", "--set", "run.root={tmp_path}"]
             + (["--query", "SELECT 42"] if "{command}" == "sql" else []))
        heavy = sorted({{m.split(".")[0] for m in sys.modules}} & {{"torch", "prefect", "transformers", "faiss"}})
        print("HEAVY", heavy)
    """)
    (tmp_path / "empty").mkdir()
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in r.stdout, r.stdout + r.stderr


def test_no_python_file_over_400_lines():
    files = [p for d in ("contramine", "pipeline", "flows", "trainer", "tests", "bench")
             for p in (ROOT / d).rglob("*.py")]
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"split these: {long}"


# The layers, lowest first: a module imports only from its own layer or below, lazily (in a function) or not, and
# under `if TYPE_CHECKING:` too (an arrow is an arrow, even one only a type checker follows). A name is matched by
# its longest prefix here: a layer is whole packages and leaves, with no per-file exceptions.
LAYERS = [
    ("shared leaves", ["contramine.pipeline.errors", "contramine.pipeline.hints", "contramine.pipeline.schema",
                       "contramine.pipeline.lazy",
                       "contramine.pipeline.markdown", "contramine.pipeline.identity", "contramine.pipeline.seeding",
                       "contramine.pipeline.row_streams",
                       "contramine.pipeline.roles", "contramine.pipeline.text_distances",
                       "contramine.pipeline.degenerate", "contramine.pipeline.codeversion",
                       "contramine.pipeline.cores"]),
    ("storage: the run folder on disk", ["contramine.pipeline.storage"]),
    ("corpus: reading the input", ["contramine.pipeline.corpus"]),
    ("config", ["contramine.pipeline.config"]),
    ("code versions", ["contramine.pipeline.codeversion"]),
    ("row memo", ["contramine.pipeline.memo"]),
    ("engine: declarations, runner, resources", ["contramine.pipeline.engine"]),
    ("models and search", ["contramine.pipeline.models", "contramine.pipeline.search"]),
    ("stages", ["contramine.pipeline.stages"]),
    ("export and report", ["contramine.pipeline.export", "contramine.pipeline.report", "contramine.pipeline"]),
    ("trainer", ["contramine.trainer"]),
    ("flows and the CLI", ["contramine.flows"]),
    ("the public surface", ["contramine"]),
    ("benches", ["bench"]),
]
PARTS = {"contramine.pipeline": "pipeline", "contramine.trainer": "trainer", "contramine.flows": "flows",
         "contramine": "contramine", "bench": "bench"}


def _module_files() -> dict[str, Path]:
    """Every module of the package and the benches by import name (contramine.pipeline.x lives in pipeline/x.py)."""
    out = {}
    for name, folder in PARTS.items():
        for p in (ROOT / folder).rglob("*.py"):
            rel = p.relative_to(ROOT / folder).with_suffix("").parts
            if name == "contramine" and rel[0] != "__init__" and len(rel) > 1:
                continue
            out[".".join((name, *rel)).removesuffix(".__init__")] = p
    return out


def _import_graph() -> dict[str, set[str]]:
    """module -> the project's modules it imports anywhere in it: top level, in functions, under TYPE_CHECKING
    (an ancestor package, which every import of a submodule runs, is no arrow)."""
    import ast
    from importlib.util import resolve_name

    files = _module_files()
    graph = {}
    for m, p in files.items():
        package = m if p.name == "__init__.py" else m.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = resolve_name("." * node.level + (node.module or ""), package) if node.level else node.module
                found |= {base, *(f"{base}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[m] = {x for x in found if x in files and x != m and not m.startswith(x + ".")}
    return graph


def _layer(module: str) -> int:
    best = (-1, -1)
    for i, (_, prefixes) in enumerate(LAYERS):
        for name in prefixes:
            if module == name or module.startswith(name + "."):
                best = max(best, (len(name), i))
    assert best[1] >= 0, f"{module} is in no layer of LAYERS: add it"
    return best[1]


def test_no_import_circle():
    """No module imports itself back through others, counting imports in functions (a circle there is a module
    that cannot be read without the other) and under TYPE_CHECKING."""
    graph = _import_graph()

    def reaches(start: str) -> set[str]:
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo += graph[m]
        return seen

    circles = sorted(m for m in graph if m in reaches(m))
    assert not circles, f"modules on an import circle: {circles}"


def test_the_run_order_follows_reads_and_writes_ties_in_declaration_order():
    """No hand-kept list: each stage runs after the stages that write what it reads; among stages ready together the
    first declared runs first (noise is declared after negate and neighbours, and backtranslate, declared first of
    all, waits for noise's variants)."""
    names = list(load_stages())
    for stage in load_stages().values():
        for table in stage.inputs:
            writer = next(s for s in load_stages().values() if table in s.writes)
            assert names.index(writer.name) <= names.index(stage.name), (writer.name, stage.name)
    assert names == ["pool_sentences", "pool_embeddings", "sentences", "embeddings", "negate", "neighbours", "noise",
                     "backtranslate", "paraphrases", "scores", "ipw", "pairs", "triplets"]


def test_every_import_points_down_the_layers():
    graph = _import_graph()
    up = sorted(f"{a} ({LAYERS[_layer(a)][0]}) -> {b} ({LAYERS[_layer(b)][0]})"
                for a, targets in graph.items() for b in targets if _layer(b) > _layer(a))
    assert not up, "imports from a higher layer:\n" + "\n".join(up)


def test_the_graph_sees_lazy_and_type_checking_imports():
    """The checks above count what they claim to: a function-level import and a TYPE_CHECKING one are arrows."""
    graph = _import_graph()
    assert "contramine.pipeline.storage.store" in graph["contramine.pipeline.engine.spec"]  # under TYPE_CHECKING
    assert "contramine.pipeline.corpus" in graph["contramine.pipeline.config.loading"]  # inside a function


def test_a_package_says_what_it_offers_and_prefixes_are_packages():
    """The house rule: a module under ~400 lines (above), or a package whose __init__ says what it offers (its
    docstring); no three files of one folder share a name prefix (`memo_*`, `gpu_*`): they are a package."""
    from collections import Counter

    silent = [str(p.relative_to(ROOT)) for d in PARTS.values() for p in (ROOT / d).rglob("__init__.py")
              if not ast_docstring(p)]
    assert not silent, f"say what these packages offer in their docstring: {silent}"
    crowded = {}
    for d in PARTS.values():
        for folder in {p.parent for p in (ROOT / d).rglob("*.py")}:
            prefixes = Counter(p.stem.split("_")[0] for p in folder.glob("*.py") if "_" in p.stem.strip("_"))
            crowded |= {f"{folder.relative_to(ROOT)}/{k}_*": n for k, n in prefixes.items() if n >= 3}
    assert not crowded, f"make these a package: {crowded}"


def ast_docstring(path: Path) -> str | None:
    import ast

    return ast.get_docstring(ast.parse(path.read_text()))


def test_an_unwritten_table_two_writers_or_a_circle_is_refused_naming_the_stages():
    from contramine.pipeline.engine.discovery import run_order
    from contramine.pipeline.engine.spec import Stage

    def toy(name, reads=(), writes=()):
        return Stage(name, None, "toy", tuple(writes), tuple(reads), ())

    assert [s.name for s in run_order([toy("b", ["a"], ["b"]), toy("a", [], ["a"]), toy("c", [], ["c"])])] \
        == ["a", "b", "c"]  # b waits for a; c, ready as early as a, keeps its declared place after b
    with pytest.raises(ImportError, match="stage b reads `x`, which no stage writes"):
        run_order([toy("b", ["x"], ["b"])])
    with pytest.raises(ImportError, match="stages a and b both write `t`"):
        run_order([toy("a", [], ["t"]), toy("b", [], ["t"])])
    with pytest.raises(ImportError, match=r"in a circle: a \(reads b\), b \(reads a\)"):
        run_order([toy("a", ["tb"], ["ta"]), toy("b", ["ta"], ["tb"])])


def test_the_cli_names_no_stage_and_no_error_class():
    """What a stage needs checked before any work is declared with it (`@stage(checks=...)`), and one base class
    marks the errors the CLI prints as one line: flows/cli.py names neither a stage nor an expected-error class."""
    import ast

    from contramine.pipeline.errors import ExpectedError

    source = (ROOT / "flows" / "cli.py").read_text()
    strings = {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not strings & set(load_stages()), strings & set(load_stages())
    names = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    for cls in ("ConfigError", "ModelUnavailable", "CorpusError", "TableMissing", "StageError"):
        assert cls not in names or cls == "ConfigError"  # (it raises ConfigError itself for an unknown stage)
    from contramine.pipeline.config import ConfigError
    from contramine.pipeline.corpus import CorpusError
    from contramine.pipeline.engine.resources import PlanError
    from contramine.pipeline.storage.tables import TableMissing
    from contramine.pipeline.models.hub import ModelUnavailable

    assert all(issubclass(c, ExpectedError) for c in (ConfigError, CorpusError, PlanError, TableMissing,
                                                     ModelUnavailable))


def test_layers_point_down_no_lower_module_imports_a_stage():
    """models/, engine/, report/ and config/ (and the shared modules beside them) import no stage module, lazily or
    not; only discovery finds the stages, in the packages of pipeline/engine/discovery.py's PACKAGES."""
    from contramine.pipeline.codeversion import PIPELINE, imported_modules

    stage_modules = {s.module for s in load_stages().values()}
    lower = [p for p in PIPELINE.rglob("*.py") if "stages" not in p.relative_to(PIPELINE).parts]
    bad = {}
    for p in lower:
        name = "contramine." + ".".join(p.relative_to(PIPELINE.parent).with_suffix("").parts)
        hits = imported_modules(p.read_text(), name) & stage_modules
        if hits:
            bad[name] = sorted(hits)
    assert not bad, bad
