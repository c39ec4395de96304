# Two commands on a fresh machine: `make run` and `make test`. Each creates .venv when missing and
# reinstalls only when pyproject.toml changed (the stamp files record that).
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { echo $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run serve test lint bench clean mypy-baseline

$(BIN)/python:
	@test -n "$(PYTHON)" || { echo "aiops needs Python >= 3.11 on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.run-stamp: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	@touch $@

$(VENV)/.test-stamp: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@ $(VENV)/.run-stamp

run: $(VENV)/.run-stamp
	$(BIN)/aiops $(ARGS)

serve: $(VENV)/.run-stamp
	$(BIN)/aiops serve $(ARGS)

test: $(VENV)/.test-stamp
	$(BIN)/ruff check aiops tests benchmarks tools
	$(BIN)/lint-imports
	$(BIN)/python tools/mypy_ratchet.py
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# mypy's tolerated errors := today's (after a merge, or once new code's errors are judged acceptable).
mypy-baseline: $(VENV)/.test-stamp
	$(BIN)/python tools/mypy_ratchet.py --update

# The proxy (benchmarks.run), then what the operator feels (benchmarks.operator: start-up, a busy
# console, gates, tokens, memory; OPERATOR_ARGS=--quick for a short run). Both run; either missing a
# target fails the make.
bench: $(VENV)/.test-stamp
	$(BIN)/python -m benchmarks.run $(ARGS); s=$$?; $(BIN)/python -m benchmarks.operator $(OPERATOR_ARGS) || s=1; exit $$s

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
