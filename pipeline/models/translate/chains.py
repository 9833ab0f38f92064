"""Translation chains as declared resources: which chains run, on which engine, device and dtype; loading them;
running rows through a chain (METHODS §3, §6).

    plan = chains_plan(cfg)                          # decided once per run, where the flow runs
    chain = load_chain(["bergamot:en-pt", "bergamot:pt-en"], cfg.backtranslate)
    table = backtranslate([(sid, variant, text), ...], "en-pt>pt-en", chain, seed=1234)

The engines are modules of their own (engines/: hf.py, engines/ct2.py, engines/bergamot.py), found through the registry in
engines/__init__.py: the one a model runs on is chosen in the plan (`engines`) and imported when it loads, and the
plan records that engine module's code version (`code`). So a stage's code version covers the engine that ran and
no other: editing engines/ct2.py recomputes nothing in a run whose chains run on Bergamot.

The plan is the law: a shard loads each model on the plan's engine, device kind, dtype and compute type, and never
decides again (a worker that cannot stops with one line: resources.PlanError). A run on Bergamot alone records the
CPU, whatever the flow's host has: Bergamot always runs there.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa

from contramine.pipeline.config.backtranslation import BacktranslateCfg, bergamot_greedy_problem, chain_name  # noqa: F401
from contramine.pipeline.config.base import ConfigError
from contramine.pipeline.codeversion import code_version
from contramine.pipeline.engine.resources import Resource, cuda_device
from contramine.pipeline.engine.spec import package_versions
from contramine.pipeline.models.bergamot_files import is_bergamot_folder
from contramine.pipeline.models.cublas import load_cublas
from contramine.pipeline.models.hub import ModelUnavailable, model_fingerprint, pick_device, resolve_model
from contramine.pipeline.models.standin import StandInTranslator, is_standin
from contramine.pipeline.models.translate.engines import ENGINES, load_engine
from contramine.pipeline.models.translate.settings import batch_token_budget, model_type, resolve_kv_cache, target_language_problem
from contramine.pipeline.roles import positive_sources
from contramine.pipeline.schema import SCHEMAS
from contramine.pipeline.row_streams import row_seeds as row_seeds_of

# model_type in config.json -> what the CTranslate2 Transformers converter knows (NLLB is model_type m2m_100)
CONVERTIBLE = {"marian", "m2m_100"}


# ---- decisions ---------------------------------------------------------------------------------------------------
def engine_for(name: str, path, cfg: BacktranslateCfg) -> str:
    """The engine that translates with model `name` (resolved to `path`): "hf", "ctranslate2" or "bergamot"."""
    if is_bergamot_folder(path):  # its own engine, whatever `engine` says (no other library runs these models)
        return "bergamot"
    if cfg.engine == "hf" or cfg.do_sample or is_standin(name):  # sampling stays on HF: per-row seeds (engines/ct2.py)
        return "hf"
    if model_type(path) in CONVERTIBLE:
        problem = ct2_cuda_problem(pick_device(cfg.device))
        if problem is None:
            return "ctranslate2"
        if cfg.engine == "auto":  # e.g. a CUDA 13 machine: the GPU check found it (BENCHMARKS.md, GPU check)
            _say_once(f"backtranslate.engine = 'auto': model {name!r} runs on HF generate, not CTranslate2: {problem}")
            return "hf"
        raise ValueError(f"backtranslate.engine = 'ctranslate2': model {name!r} cannot run on this GPU: {problem}; "
                         f"set backtranslate.engine = 'auto' (HF generate there) or backtranslate.device = 'cpu'")
    if cfg.engine == "auto":
        return "hf"
    raise ValueError(f"backtranslate.engine = 'ctranslate2': model {name!r} ({model_type(path)}) cannot be converted "
                     f"by CTranslate2 (it converts {', '.join(sorted(CONVERTIBLE))}); use engine = 'auto' to run it on HF")


CT2_CUDA_LIBRARY = "libcublas.so.12"  # what the ctranslate2 4.x wheels dlopen on a GPU (cublas.py)
_said: set[str] = set()


def _say_once(line: str) -> None:
    if line not in _said:
        _said.add(line)
        print(line, flush=True)


def ct2_cuda_problem(device: str) -> str | None:
    """None when CTranslate2 can translate on `device`; else one line why not. On a CPU: None. On a GPU: its wheels
    load CUDA 12's cuBLAS when a translator starts, and a machine with only CUDA 13 (the lent H100, torch cu130)
    fails there ("Library libcublas.so.12 is not found") unless the nvidia-cublas-cu12 pip package is installed: the
    same load (pipeline/models/cublas.py), before any model loads."""
    if not device.startswith("cuda"):
        return None
    try:
        import ctranslate2  # ctranslate2: only a GPU hop of that engine asks (and it may be missing)
    except ImportError as e:
        return f"ctranslate2 is not installed ({e})"
    if ctranslate2.get_cuda_device_count() == 0:
        return "ctranslate2 sees no CUDA device (a CPU-only build, or no driver)"
    if load_cublas(CT2_CUDA_LIBRARY) is None:
        return (f"{CT2_CUDA_LIBRARY} cannot be loaded (CTranslate2's wheels need CUDA 12's cuBLAS: pip install "
                f"nvidia-cublas-cu12, or a CUDA 12 toolkit on the loader path)")
    return None


def resolve_compute_type(setting: str, device: str) -> str:
    if setting != "auto":
        return setting
    return "float16" if device.startswith("cuda") else "int8"  # the published speed-ups' settings (PEERS.md)


def resolve_dtype(setting: str, device: str) -> str:
    """HF generate's dtype: half precision on a GPU that has it, float32 on CPU (half is slower here, and some ops
    lack kernels)."""
    if setting != "auto":
        return setting
    if device.startswith("cuda"):
        import torch  # torch: only a GPU hop asks; planning a chain does not load it

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float32"


def _availability(bt: BacktranslateCfg) -> tuple[list[str], list[tuple[str, str, str]], dict[str, str]]:
    """(chains that can run, (chain, model, reason) of those skipped, model -> engine). Resolves (downloads where
    needed) every model: called once per run, by `chains_plan`, in the flow's process."""
    used, skipped, engines = [], [], {}
    for chain in bt.chains:
        problem = None
        for model in chain.models:
            try:
                path = resolve_model(model, "translation model")
            except ModelUnavailable as e:
                problem = (model, str(e))
                break
            if is_bergamot_folder(path):  # greedy only (a bergamot:<name> is checked in config)
                greedy = bergamot_greedy_problem(bt, model)
                if greedy is not None:
                    raise ConfigError(greedy)
            else:
                language = target_language_problem(model, path, bt)
                if language is not None:
                    raise ConfigError(language)
            try:
                engines[model] = engine_for(model, path, bt)
            except ValueError as e:  # engine = "ctranslate2" with a model its converter lacks
                raise ConfigError(str(e)) from None
        if problem is None:
            used.append(chain.name)
        elif bt.fallback:
            skipped.append((chain.name, *problem))
        else:
            raise ModelUnavailable(problem[1])
    return used, skipped, engines


def chains_plan(cfg, store=None, n: int = 0, plan: dict | None = None) -> dict:
    """The run's translation decisions: the chains that run and those skipped; each used model's files and engine
    (with its compute type on CTranslate2); the device kind and dtype generation runs at (the CPU when every model
    runs on Bergamot); HF generate's static cache and compilation where asked for; the code version of each engine
    module that runs; library versions."""
    bt = cfg.backtranslate
    used, skipped, engines = _availability(bt)
    models = sorted({m for c in bt.chains if c.name in used for m in c.models})
    kinds = sorted({engines[m] for m in models})
    device = pick_device(bt.device) if set(kinds) - {"bergamot"} else "cpu"
    compute = resolve_compute_type(bt.compute_type, device)
    out: dict[str, Any] = {"used": used, "skipped": {c: m for c, m, _ in skipped},
           "models": {m: model_fingerprint(resolve_model(m, "translation model")) for m in models},
           "engines": {m: f"ctranslate2:{compute}" if engines[m] == "ctranslate2" else engines[m] for m in models},
           "device": device.split(":")[0], "code": {k: code_version(ENGINES[k].module) for k in kinds},
           "versions": package_versions(*dict.fromkeys(p for k in kinds for p in ENGINES[k].packages))}
    if out["device"] == "cuda":  # a GPU's rows may depend on their batch: its budget is keyed (never a CPU's)
        out["batching"] = batching_facts(bt, device, kinds)
    if "hf" in kinds:
        out["dtype"] = resolve_dtype(bt.dtype, device)
        kv_cache = resolve_kv_cache(bt.kv_cache, device)
        if kv_cache != "dynamic" or bt.compile:  # only where it departs from the plain path: keys stay as they were
            out["decoding"] = {"kv_cache": kv_cache, "compile": bt.compile}
        if out["device"] == "cuda":  # a GPU's loop and generate need not agree to the bit (a CPU's do: not keyed)
            out["decoding"] = {**out.get("decoding", {}), "decoder": bt.decoder}
    return out


def batching_facts(bt, device: str, kinds) -> dict:
    """Each torch / CTranslate2 engine's batch budget on `device`: its token budget (batch_token_budget), or the
    rows a batch takes where that is 0. Keyed on a GPU only: there a row's output may depend on its batch (kernels
    chosen by shape, padding), on a CPU it does not (tests/test_backtranslate.py: each row alone equals the batch)."""
    out = {}
    for kind in sorted(set(kinds) & {"hf", "ctranslate2"}):
        budget = batch_token_budget(bt.batch_tokens, device, kind)
        out[kind] = {"tokens": budget} if budget else {"rows": bt.batch_size}
    return out


def positives_plan(cfg, store=None, n: int = 0, plan: dict | None = None) -> dict:
    """Where DebCSE's positive candidates come from (the `scores` stage's one translation decision): from the run's
    `chains` decision when an earlier stage of the run took it, else decided here."""
    chains = (plan or {}).get("chains") or chains_plan(cfg)
    return {"sources": positive_sources(cfg, chains)}


# ---- loading -----------------------------------------------------------------------------------------------------
def load_translator(name: str, cfg: BacktranslateCfg, plan: dict | None = None):
    """Model `name` on the plan's engine and device (resolves nothing but its folder); without a plan, on what a
    chain of that one model would be planned on."""
    if plan is None:
        return load_chain([name], cfg)[0]
    if is_standin(name):
        return StandInTranslator(name, cfg.num_return_sequences)  # same interface, no weights: `make scale`
    engine, _, compute = plan["engines"][name].partition(":")
    device = "cpu" if engine == "bergamot" else cuda_device(plan["device"], f"translation model {name}")
    return load_engine(engine, name, resolve_model(name, "translation model"), cfg, device,
                       compute or plan.get("dtype"))  # the engine the plan chose, and no other (module doc)


def load_chain(names: list[str], cfg: BacktranslateCfg, plan: dict | None = None) -> list:
    """One translator per hop, on the plan's engines (a chain of its own when no plan is given: tests, benches); a
    model named twice (e.g. one M2M100 both ways) is loaded once."""
    if plan is None:
        alone = BacktranslateCfg.model_validate({**cfg.model_dump(), "chains": [list(names)], "fallback": False})
        plan = chains_plan(SimpleNamespace(backtranslate=alone))  # (what chains_plan reads of a Config)
    loaded: dict = {}
    for n in names:
        if n not in loaded:
            loaded[n] = load_translator(n, cfg, plan)
    return [loaded[n] for n in names]


def load_chains(cfg, store=None, n: int = 0, plan: dict | None = None) -> dict:
    """{chain name: its loaded translators} for the chains of the plan (a model that no longer loads stops the
    shard: the run's decision is not taken again here)."""
    bt, plan = cfg.backtranslate, plan or chains_plan(cfg)
    return {c.name: load_chain(list(c.models), bt, plan) for c in bt.chains if c.name in plan["used"]}


CHAINS = Resource("chains", chains_plan, load_chains, reads=("backtranslate",))


def check_chains(cfg) -> tuple[list[str], dict]:
    """Before any work: the run's chains decided once (every model resolved, downloaded where needed), with what
    they can and cannot do in plain words; the run keeps this decision (`chains` in its plan)."""
    chains = chains_plan(cfg)
    return generator_notes(cfg, chains), {"chains": chains}
POSITIVES = Resource("positives", positives_plan)  # a decision only: `scores` reads ctx.plan["positives"]


# ---- running a chain ---------------------------------------------------------------------------------------------
def backtranslate(rows: list[tuple[int, int, str]], chain_name: str, translators: list,
                  seed: int = 0, progress: bool = False, role: str = "both") -> pa.Table:
    """Translate (sid, variant, text) rows through the chain, one hop after another.

    Intermediate hops keep their first return only; the last hop returns num_return_sequences texts, each its own
    output row (same sid, variant and pivot_text), so with k returns a row yields k outputs of one pivot.
    pivot_text is the first hop's output. Rows come out in input order, returns in order within a row. `role` (the
    chain's ChainCfg.role) is recorded on every row.
    """
    if not translators:
        raise ValueError(f"chain {chain_name!r} has no models")
    pivots, outputs = translate_rows(rows, translators, seed, progress)
    return chain_table(rows, pivots, outputs, chain_name, " > ".join(t.name for t in translators), role)


class LazySeeds(Sequence):
    """The rows' seeds (`seeds_of()`: all of them, computed together), computed when one is first read: greedy and
    beam decoding never read a row's seed, and the 1M path's ~10M hop-rows would spend time hashing seeds nothing
    draws from. A row's seed is the same whenever (and whether) it is read."""

    def __init__(self, n: int, seeds_of: Callable[[], list[int]]):
        self.n, self.seeds_of, self._known = n, seeds_of, None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if self._known is None:
            self._known = list(self.seeds_of())
        return self._known[i]


def translate_rows(rows: list[tuple[int, int, str]], translators: list, seed: int = 0,
                   progress: bool = False) -> tuple[list[str], list[list[str]]]:
    """(pivot text, the last hop's returns) of each (sid, variant, text) row: a function of the row alone (its seed
    comes from the run seed, its sid and variant; every engine's outputs are batch-independent)."""
    # computed only where an engine reads them (sampling): LazySeeds, all rows at once when one is read
    seeds = LazySeeds(len(rows), lambda: row_seeds_of(seed, "backtranslate", [r[0] for r in rows],
                                                      [r[1] for r in rows]))
    current, pivots, out = [text for _, _, text in rows], None, []
    for hop, tr in enumerate(translators):
        last = hop == len(translators) - 1
        hop_seeds = LazySeeds(len(rows), lambda hop=hop: row_seeds_of(  # type: ignore[misc]  # hop=hop binds the hop
            np.array(seeds[:], np.uint64), "backtranslate-hop", np.full(len(rows), hop)))
        out = tr.translate(current, hop_seeds, progress, num_return_sequences=None if last else 1)
        if pivots is None:
            pivots = [o[0] for o in out]
        if not last:
            current = [o[0] for o in out]
    return pivots or [], out


def chain_table(rows: list[tuple[int, int, str]], pivots: list[str], outputs: list[list[str]], chain_name: str,
                model: str, role: str) -> pa.Table:
    """`backtranslations` rows of one chain: one per (row, return), in row order, returns in order."""
    cols: dict[str, list] = {k: [] for k in SCHEMAS["backtranslations"].names}
    for (sid, variant, _), pivot, hyps in zip(rows, pivots, outputs):
        for text in hyps:
            for key, val in zip(cols, (sid, chain_name, variant, pivot, text, model, role, None)):
                cols[key].append(val)  # flag: set by the stage (pipeline/degenerate.py)
    return pa.Table.from_pydict(cols, schema=SCHEMAS["backtranslations"])


def generator_notes(cfg, chains: dict) -> list[str]:
    """What the translation chains can and cannot do in this run (its `chains` plan), in plain words (printed once
    per run)."""
    used, skipped, engines = chains["used"], chains["skipped"], chains["engines"]
    notes = [f"backtranslate: cannot load {model} (not available here) → chain {chain} skipped"
             for chain, model in skipped.items()]
    on_ct2 = [m for m, e in engines.items() if e.startswith("ctranslate2")]
    on_hf = [m for m, e in engines.items() if e == "hf"]
    if cfg.backtranslate.engine != "hf" and on_ct2:
        notes.append(f"backtranslate: {', '.join(on_ct2)} on CTranslate2 ({engines[on_ct2[0]].split(':', 1)[1]})")
    if cfg.backtranslate.engine != "hf" and on_hf:
        why = "sampling needs per-row seeds" if cfg.backtranslate.do_sample else \
            "CTranslate2 does not convert its architecture"
        notes.append(f"backtranslate: {', '.join(on_hf)} on Hugging Face generate ({why})")
    chain_cfgs = cfg.backtranslate.chains
    pos_chains = [c.name for c in cfg.backtranslate.chains_for("positives") if c.name in used]
    para_chains = [c.name for c in cfg.backtranslate.chains_for("paraphrases") if c.name in used]
    if not chain_cfgs or skipped:
        pos = {"noise": "the noise variants (a stand-in for back-translations)",
               "backtranslation": "back-translations by " + (", ".join(pos_chains) or "no chain: none")}
        what = "no back-translation chain is configured" if not chain_cfgs else \
            ("no back-translation chain could be loaded" if not used else f"only {', '.join(used)} will run")
        notes.append(f"{what}: DebCSE positive candidates come from "
                     f"{' and '.join(pos[s] for s in positive_sources(cfg, chains))}"
                     + ("" if para_chains else "; OssCSE triplets get no paraphrase (negations only)"))
    return notes
