# `make test` and `make demo` each set up .venv when it is missing or stale.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The one place torch is pinned: this build is a CPU wheel on the development machines.
# On a CUDA box: make TORCH_SPEC=torch test
TORCH_SPEC ?= torch==2.13.0

.PHONY: test demo bench lint clean

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

test: $(VENV)/.installed
	$(PY) -m pytest -q

demo: $(VENV)/.installed
	$(PY) -m dask_cosim demo

# The default benchmark: our pipeline, the floors and the peers side by side, one run;
# prints the table and writes benchmarks/results/<name>.json and .png.
bench: $(VENV)/.installed
	$(PY) benchmarks/pairwise.py

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check dask_cosim tests benchmarks
	$(VENV)/bin/mypy dask_cosim

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache
