# The one entry point: make run (demo), make test (suite), make bench (figures).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PROTOS := $(wildcard proto/*.proto)
GENERATED := $(PROTOS:.proto=_pb2.py)

BENCH_VENV ?= .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed-stamp
BENCH_ARGS ?=
FLINK_VENV ?= .venv-flink
FLINK_STAMP := $(FLINK_VENV)/.installed-stamp

.PHONY: install proto run test test-fast lint docs bench clean

install: $(STAMP) proto

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -e '.[dev]'
	@touch $@

proto: $(GENERATED)

$(GENERATED): $(PROTOS) $(STAMP)
	@$(PY) setup.py generate_protos

run: install
	@rm -rf out/wordcount
	@$(VENV)/bin/weir run examples/wordcount.py

test: install
	@$(PY) -m pytest -q

# The unit and rule tests only, for work in progress: no real master, container, cluster or
# Spark-heavy test (markers `processes` and `slow`, tests/conftest.py); `make test` is the
# whole suite, what CI and the README run.
test-fast: install
	@$(PY) -m pytest -q -m "not processes and not slow"

# The peers (Bytewax, Quix Streams), the chart (matplotlib) and the Kafka row's private
# broker (noida-db) go into the bench environment only. Quix Streams pins confluent-kafka
# below 2.13 there; Weir's Kafka source and sink are tested with that version too.
$(BENCH_STAMP): pyproject.toml
	@test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	@$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	@$(BENCH_VENV)/bin/python -m pip install -q -e '.[ray]' bytewax quixstreams matplotlib noida-db==0.2.2
	@touch $@

# Apache Flink for the Nexmark row, in a venv of its own: PyFlink pins old apache-beam,
# protobuf and grpc. The bench runs its jobs with this venv's Python as a subprocess.
$(FLINK_STAMP):
	@test -x $(FLINK_VENV)/bin/python || $(PYTHON) -m venv $(FLINK_VENV)
	@echo '*' > $(FLINK_VENV)/.gitignore
	@$(FLINK_VENV)/bin/python -m pip install -q --upgrade pip
	@$(FLINK_VENV)/bin/python -m pip install -q apache-flink==2.3.0
	@touch $@

bench: install $(BENCH_STAMP) $(FLINK_STAMP)
	@$(BENCH_VENV)/bin/python -m bench $(BENCH_ARGS)

docs: install
	@NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: install
	@$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(FLINK_VENV) proto/*_pb2*.py proto/*_pb2*.pyi site build
