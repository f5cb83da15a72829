# One venv, made on first use; every target below sets itself up.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench lint proto clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench,postgres,dask,ray]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) benchmarks/demo.py

# Three pytest workers (pytest-xdist), a test file to each at a time: module fixtures are set
# up once, and every test keeps its own ports, folders and PostgreSQL database.
# The numba kernels are compiled into their cache once first (fedsketch.server.decode.warm), not
# by every worker and process of the suite at once. OpenBLAS runs one thread in each process: three
# workers and their processes already fill the cores, and OpenBLAS's threads spin while they wait
# (measured: a Lloyd-heavy test took 29.5 CPU s with its default two threads, 15.9 with one, on
# an idle 2-core machine; the goldens are the same bits either way).
test: export OPENBLAS_NUM_THREADS = 1
test: $(STAMP)
	$(PY) -m ruff check api common client server tests benchmarks examples
	$(PY) -m fedsketch.server.decode.warm
	$(PY) -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

lint: $(STAMP)
	$(PY) -m ruff check api common client server tests benchmarks examples

# Regenerate common/pb from proto/ (the generated files are checked in).
proto: $(STAMP)
	rm -rf build/proto && mkdir -p build/proto
	$(PY) -m grpc_tools.protoc -Ifedsketch/common/pb=proto --python_out=build/proto \
		--grpc_python_out=build/proto --pyi_out=build/proto proto/fedsketch.proto
	cp build/proto/fedsketch/common/pb/fedsketch_pb2*.py* common/pb/

clean:
	rm -rf $(VENV) build *.egg-info
