# One command each, on a fresh machine: every target creates or updates .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: run test check bench fmt clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "nanobot needs Python 3.11 or newer (PYTHON=$(PYTHON))")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/nanobot onboard
	$(BIN)/nanobot gateway

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

check: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m bench

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
