# `make test` and `make demo` each set up .venv when it is missing or stale.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The one place torch is pinned: this build is a CPU wheel on the development machines.
# On a CUDA box: make TORCH_SPEC=torch test
TORCH_SPEC ?= torch==2.13.0

.PHONY: test test-min demo bench lint docs clean

# $(call install,VENV,EXTRAS[,MORE]): the venv VENV (made when missing) with torch, this
# project (editable) with its extras EXTRAS, and MORE (requirement arguments); then the
# target's stamp.  pip installs torch, so that TORCH_SPEC and pip's own configuration
# choose the build (a CPU one where one is at hand); uv the rest, resolving to the same
# versions as pip but faster.  Compiled to bytecode at install, as pip does: where
# PYTHONDONTWRITEBYTECODE is set, every process would otherwise compile its imports anew.
define install
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip uv
	$(1)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(1)/bin/python -m uv pip install -q --compile-bytecode --python $(1)/bin/python \
		-e ".[$(2)]" $(3)
	touch $@
endef

$(VENV)/.installed: pyproject.toml Makefile
	$(call install,$(VENV),dev)

# Two test processes (pytest-xdist), each taking the next test when it is free: on the
# 2-core CI machine the suite spends much of its time starting processes and clusters,
# and ran in 13 minutes so against 20 in one process.  PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 2
PYTEST_PROCESSES = -n $(PYTEST_WORKERS) --dist worksteal
test: $(VENV)/.installed
	$(PY) -m pytest -q $(PYTEST_PROCESSES)

# The core tests against the oldest versions pyproject.toml admits (.ci/min-versions.txt),
# in a venv of their own.
VENV_MIN ?= .venv-min
MIN_EXTRAS = test,bench
$(VENV_MIN)/.installed: pyproject.toml Makefile .ci/min-versions.txt
	$(call install,$(VENV_MIN),$(MIN_EXTRAS),-c .ci/min-versions.txt $$(grep -v '^#' .ci/min-versions.txt))

test-min: $(VENV_MIN)/.installed
	$(VENV_MIN)/bin/python -m pip list 2>/dev/null | grep -iE '^(dask|distributed|pandas|pyarrow|numpy|torch) '
	$(VENV_MIN)/bin/python -m pytest -q $(PYTEST_PROCESSES) \
		--ignore=tests/test_notebooks.py --ignore=tests/test_peers.py

# The demo needs the core and matplotlib (its histogram.png), not the test tools and
# example models of the dev extra: a stamp of its own, so that `make demo` on a fresh
# clone installs only that, and `make test` later adds the rest.
$(VENV)/.installed-demo: pyproject.toml Makefile
	$(call install,$(VENV),bench)

demo: $(VENV)/.installed-demo
	$(PY) -m dask_cosim demo

# The default benchmark: our pipeline, the floors and the peers side by side, one run;
# prints the table and writes benchmarks/results/<name>.json and .png.  On a CUDA machine,
# python -m benchmarks.pairwise_gpu runs the same table plus the GPU rows.
bench: $(VENV)/.installed
	$(PY) -m benchmarks.pairwise

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check dask_cosim tests benchmarks
	$(VENV)/bin/ruff format --check dask_cosim tests benchmarks
	$(VENV)/bin/mypy dask_cosim

# The documentation site: docs/ -> docs/_build/html, every warning an error, offline.
# The core (the API pages import dask_cosim) and the docs extra, not the dev extra: a stamp
# of its own, as for the demo.
$(VENV)/.docs-installed: pyproject.toml Makefile
	$(call install,$(VENV),docs)

docs: $(VENV)/.docs-installed
	$(VENV)/bin/sphinx-build -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf $(VENV) $(VENV_MIN) .pytest_cache .hypothesis .mypy_cache .ruff_cache docs/_build docs/generated
