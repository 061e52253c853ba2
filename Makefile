# The two commands of the quick start. Both install what they need first (scripts/setup.sh).
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: serve test lint setup

serve:
	@scripts/setup.sh
	$(PY) -m wsserver $(ARGS)

test:
	@scripts/setup.sh --test
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -m "not gpu" -q -ra $(ARGS)

lint:
	$(PY) -m ruff check . && $(PY) -m ruff format --check .
