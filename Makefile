# Two commands do all setup on a fresh machine: `make demo` and `make test`.
# Each creates (or refreshes) the virtualenv in $(VENV) and installs trt-bridge with its dev extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py

test: $(STAMP)
	$(PY) -m pytest -n 2 -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check trt_bridge tests scripts

bench: $(STAMP)
	$(PY) scripts/bench_convert.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
