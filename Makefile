# `make run` and `make test` set everything up on a fresh machine (Python >= 3.11), then do their job.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test install docs clean

EXTRAS := .[test,parquet,timm,hf,postgres,ray,docs,claims]

# uv installs the 6.4 GB of wheels (all of `make install` ~12 s with uv's cache warm; pip took ~95 s), from the sources
# pip is configured with (scripts/pip-sources); if uv fails, pip installs as before. Nothing is byte-compiled at install: uv's
# --compile-bytecode compiles every module of every wheel (transformers', ray's, scipy's: 55 CPU-s, ~30 s of a 41-s
# install), where a run or the tests import a share of them, compiled on first import and written to __pycache__
# (below) for every later process.
# Bytecode is written even where the shell sets PYTHONDONTWRITEBYTECODE (empty = unset for Python): without it every
# process compiles again what it imports (~4.5 CPU-s for torch, pandas and the harness), and every pytest process
# assertion-rewrites the ~130 test and harness modules again (~6 CPU-s each; the rewritten .pyc files go to the
# ignored __pycache__ folders).
export PYTHONDONTWRITEBYTECODE =
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade -c constraints.txt pip setuptools uv
	sources=$$($(BIN)/python scripts/pip-sources $(BIN)/python) \
	&& $(BIN)/uv pip install --quiet --python $(BIN)/python --index-strategy unsafe-best-match \
		$$sources -c constraints.txt -e '$(EXTRAS)' \
	|| { echo "uv could not install; installing with pip" >&2; \
	     $(BIN)/python -m pip install --quiet -c constraints.txt -e '$(EXTRAS)'; }
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/bench run suites/attention_scaling --quick

# The tests run on both cores (pytest-xdist, one module per worker, the longest modules first: tests/conftest.py's
# SLOW_MODULES_FIRST, kept by --no-loadscope-reorder), then the `serial` ones alone: those judge timings or the
# machine's load, which a test running beside them would disturb.
test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not serial" --durations=25
	$(BIN)/python -m pytest -q -m serial --durations=10

# The docs site (mkdocs-material): docs/ and mkdocs.yml; the CLI, metrics and claims references are generated from the
# code at build time (docs/hooks.py). `--strict` makes a broken link or a page missing from the nav an error.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build site *.egg-info
