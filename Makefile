# The two commands of the README. Both do all set-up (apt packages, virtualenv) first.
SHELL := /bin/bash
PY := .venv/bin/python
# the virtualenv's tools first (nvcc from NVIDIA's wheels when the machine has no CUDA toolkit: tools/setup.sh)
export PATH := $(CURDIR)/.venv/bin:$(PATH)
DEMO_BUDGET ?= 60

.PHONY: setup demo test test-unit test-farm bench clean

setup:
	@bash tools/setup.sh

## make demo: tune the bundled conv net and transformer on this machine, print tables, write reports to out/
demo: setup
	@mkdir -p out
	EDGETUNE_HOME=$(CURDIR)/out/home .venv/bin/edgetune tune mobilenet --budget $(DEMO_BUDGET) --sweep batch=1,16 --brief --report-dir out/mobilenet
	EDGETUNE_HOME=$(CURDIR)/out/home .venv/bin/edgetune tune transformer --budget $(DEMO_BUDGET) --sweep seq=32,128 --brief --report-dir out/transformer
	@echo "reports: out/mobilenet/report.md out/transformer/report.md"

## make test: the whole suite, farm included (sshd, qemu board, adb server + phone emulator on 127.0.0.1)
## Two xdist workers per core, at most 8: on a busy machine the suite's share of the CPU grows with its
## runnable workers (docs/results/suite-time.md has the figures). TEST_WORKERS overrides.
TEST_WORKERS ?= $(shell n=$$(( 2 * $$(nproc) )); echo $$(( n < 8 ? n : 8 )))
test: setup
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=40 tests

test-unit: setup
	$(PY) -m pytest -q tests/unit

test-farm: setup
	$(PY) -m pytest -q tests/farm

bench: setup
	$(PY) tools/bench/bench_runtime.py

clean:
	rm -rf out build .pytest_cache
