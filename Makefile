# One venv, made on first use; every target below sets itself up.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) benchmarks/demo.py

test: $(STAMP)
	$(PY) -m ruff check common client server tests benchmarks
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

lint: $(STAMP)
	$(PY) -m ruff check common client server tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
