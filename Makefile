# Two commands do all setup on a fresh machine: `make demo` and `make test`.
# Each creates (or refreshes) the virtualenv in $(VENV) and installs trt-bridge with its dev extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: demo test lint docs bench corpus pipeline-example clean

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/demo.py

test: $(STAMP)
	$(PY) -m pytest -n 2 -q $(PYTEST_ARGS)

# The documentation site (mkdocs.yml, docs/) into site/; --strict fails on a broken link or API reference
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

lint: $(STAMP)
	$(PY) -m ruff check trt_bridge plugins tests scripts

bench: $(STAMP)
	$(PY) scripts/bench_convert.py

# The real-export corpus (torch exports × quantizers, each in its own venv under .corpus/venvs) and its matrix
corpus: $(STAMP)
	$(PY) scripts/corpus/build.py .corpus

# The example manifest: every shared zoo model and the built-in fixtures, converted, checked, verified,
# benchmarked (onnxruntime) and built ahead of time for SM 8.9; engine runs are skipped without a GPU.
pipeline-example: $(STAMP)
	$(PY) scripts/pipeline/make_fixtures.py
	$(VENV)/bin/trt-bridge pipeline scripts/pipeline/example.yaml --output pipeline-output

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache demo-output pipeline-example pipeline-output site
