# The README's two commands: `make bench` (the quick benchmark) and `make test`.
PYTHON ?= python3
SHARED_DATA := $(abspath ../shared/data)
ifneq ($(wildcard $(SHARED_DATA)),)
export GPSCALE_DATA ?= $(SHARED_DATA)
endif

.PHONY: install install-docs test bench lint docs docs-check

install:
	$(PYTHON) -m pip install -q torch==2.13.0
	$(PYTHON) -m pip install -q -e ".[dev,bench]"

# two pytest-xdist workers of one thread each (tests/conftest.py): most tests are small matrices, which a second
# thread does not speed up and a second worker does. Work stealing: a worker that runs out takes the other's queued
# tests, so the suite does not end on one worker's long tail (with the README and Ctrl-C tests trimmed: 640 -> 552 s
# on the 2-core machine)
test: install
	$(PYTHON) -m pytest -q -n 2 --dist worksteal

bench: install
	$(PYTHON) -m gpscale.cli bench --protocol quick --out results/quick

install-docs: install
	$(PYTHON) -m pip install -q -e ".[docs]"

# the site, strict (a warning is an error): the examples run first and draw the figures the pages show
docs: install-docs
	$(PYTHON) -m tools.docs_examples --out docs/generated
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict

# the built site in headless Chromium (Debian's chromium and chromium-driver): every page, link, image and console
docs-check: docs
	$(PYTHON) -m tools.check_site --site site --screenshots site-check

lint:
	$(PYTHON) -m ruff check src tests experiments
