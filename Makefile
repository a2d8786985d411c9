# The README's two commands: `make bench` (the quick benchmark) and `make test`.
PYTHON ?= python3
SHARED_DATA := $(abspath ../shared/data)
ifneq ($(wildcard $(SHARED_DATA)),)
export GPSCALE_DATA ?= $(SHARED_DATA)
endif

.PHONY: install test bench lint

install:
	$(PYTHON) -m pip install -q torch==2.13.0
	$(PYTHON) -m pip install -q -e ".[dev,bench]"

# two pytest-xdist workers of one thread each (tests/conftest.py): most tests are small matrices, which a second
# thread does not speed up and a second worker does
test: install
	$(PYTHON) -m pytest -q -n 2

bench: install
	$(PYTHON) -m gpscale.cli bench --protocol quick --out results/quick

lint:
	$(PYTHON) -m ruff check src tests experiments
