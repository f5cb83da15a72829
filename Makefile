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
# The package's own modules are byte-compiled once first: the editable install imports them from
# the source folders, and where PYTHONDONTWRITEBYTECODE is set (as on the shared test machine) no
# process writes their .pyc, so every CLI call, coordinator and daemon of the suite compiled ~200
# modules again (measured: importing the CLI, the coordinator and the daemon took 0.97 CPU s
# without the .pyc files, 0.71 with them; `coordinator serve` to ready 0.96 -> 0.65 s).
# compileall only rewrites files whose source changed; Python checks each .pyc against its source.
test: export OPENBLAS_NUM_THREADS = 1
test: $(STAMP)
	$(PY) -m ruff check api common client server tests benchmarks examples
	$(PY) -m compileall -q -j0 api common client server
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
