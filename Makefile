# dnsprobe — the two commands a new machine needs: `make demo` and `make test` (run as root on Debian).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SAMPLE := samples/sample-mix.pcap.xz
DEMO_OUT := demo-out

.PHONY: demo test lint bench deps venv clean

# Debian packages the tests, demo and benchmarks use (see the script). Installed only when missing.
deps:
	@bash contrib/install-deps.sh

$(VENV)/.installed: pyproject.toml setup.py $(wildcard */*/*.c include/*.h) | deps
	@$(PYTHON) -m venv --help >/dev/null 2>&1 || { \
	  export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip 'setuptools>=77'  # also for in-place builds: python setup.py build_ext -i
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	@mkdir -p $(DEMO_OUT) && rm -rf $(DEMO_OUT)/*
	@echo "== dnsprobe read $(SAMPLE) -o $(DEMO_OUT)"
	$(VENV)/bin/dnsprobe read $(SAMPLE) -o $(DEMO_OUT)
	@echo "== files written"
	@ls -l $(DEMO_OUT)
	@echo "== a few records (dnsprobe inspect)"
	$(VENV)/bin/dnsprobe inspect $(DEMO_OUT)/*.parquet --limit 8
	@bash contrib/live-demo.sh $(VENV)/bin/dnsprobe $(SAMPLE) $(DEMO_OUT)/live

test: deps venv
	$(PY) -m pytest -q

lint: venv
	$(VENV)/bin/ruff check probe export tests benchmarks
	$(VENV)/bin/lint-imports  # the layers contract in pyproject.toml

bench: venv
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/offline.py
	$(PY) benchmarks/live.py
	$(VENV)/bin/dnsprobe bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(DEMO_OUT) benchmarks/cache
