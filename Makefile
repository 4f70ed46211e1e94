# The two commands of the README: `make demo` and `make test`. Both set everything up on a
# fresh machine (Debian packages, a virtual environment, torch pinned to the CPU build).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint typecheck unit clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt scripts/install-system-deps.sh
	bash scripts/install-system-deps.sh
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0 -c constraints.txt
	$(PY) -m pip install --quiet -e '.[dev]' -c constraints.txt
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/eagleeye demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(PY) -m pytest -m "not slow"

test: lint typecheck
	$(PY) -m pytest

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
