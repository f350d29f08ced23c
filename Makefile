# Two commands do all the set-up on a fresh machine:
#   make demo   installs cusp into .venv and runs the service with a demo stream
#   make test   installs cusp (with test extras) into .venv and runs the test suite
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo test test-slow bench promtool chromium clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml setup.py models/_native.c | $(VENV)/bin/python
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0" || $(PY) -m pip install -q "torch>=2.3,<=2.13.0" --index-url https://download.pytorch.org/whl/cpu
	$(PY) -m pip install -q -e ".[test,bench]"
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

demo: install
	$(VENV)/bin/cusp serve --demo

test: install promtool chromium
	$(PY) -m pytest $(PYTEST_ARGS)

test-slow: install promtool
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

bench: install
	$(VENV)/bin/cusp bench

clean:
	rm -rf $(VENV) .cusp .pytest_cache
