# Two commands on a fresh machine: `make demo` and `make test` (see README).
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: venv demo test lint typecheck unit benchmarks clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first: 2.13.0 is a local CPU wheel; any other resolution pulls CUDA packages.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

demo: venv
	$(BIN)/cerebro-spark run conf/experiments/digits.yaml

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

# TEST_PROCESSES=N runs the suite in N pytest processes (pytest-xdist, a test file each at
# a time); the default, 0, runs it in this one. Measured on a 2-core machine: 2 processes
# took 4,345 s where one took 4,159 s on a slightly smaller suite (it is CPU-bound).
# pytest exits 5 when it collected no test: report it, don't fail on it.
TEST_PROCESSES ?= 0
test: lint typecheck
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadfile; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi; exit $$rc

unit: venv
	$(BIN)/pytest -m "not torch and not spark and not slow" -q

benchmarks: venv
	$(BIN)/python benchmarks/mop_makespan.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache runs
