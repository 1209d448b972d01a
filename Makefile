# dnsprobe — the two commands a new machine needs: `make demo` and `make test` (run as root on Debian).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SAMPLE := samples/sample-mix.pcap.xz
DEMO_OUT := demo-out

.PHONY: demo test lint bench deps venv clean asan test-asan test-asan-ci fuzz-deps fuzz-build fuzz fuzz-ci fuzz-merge fuzz-coverage

# Debian packages the tests, demo and benchmarks use (see the script). Installed only when missing.
deps:
	@bash contrib/install-deps.sh

$(VENV)/.installed: pyproject.toml setup.py $(wildcard */*.c */*/*.c include/*.h include/*.c) | deps
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
	$(VENV)/bin/ruff check probe export tests benchmarks fuzz
	$(VENV)/bin/lint-imports  # the layers contract in pyproject.toml

bench: venv
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/offline.py
	$(PY) benchmarks/live.py
	$(PY) benchmarks/dnstap.py
	$(VENV)/bin/dnsprobe bench $(BENCH_ARGS)

# Sanitizer build: every C extension built by clang with AddressSanitizer and UndefinedBehaviorSanitizer into
# build/asan, never over the in-place .so files of the normal build; DNSPROBE_NATIVE_DIR makes the package load
# them from there (probe/native.py: one missing there is an import error, not a silent use of the other build).
# make test-asan runs the tests with the ASan runtime preloaded into the (uninstrumented) Python, whose objects
# then come from malloc (PYTHONMALLOC), so that ASan sees them. Leak detection is off: CPython leaves much
# allocated at exit by design. A finding ends the process; its report goes to build/asan/reports, printed after.
ASAN_DIR := build/asan
SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
ASAN_TESTS ?= tests

asan: venv
	@bash contrib/install-deps.sh sanitizers
	rm -rf $(ASAN_DIR)
	CC=clang LDSHARED="clang -shared" CFLAGS="$(SANITIZE) -g" LDFLAGS="$(SANITIZE) -shared-libasan" \
	  $(PY) setup.py -q build_ext --build-lib $(ASAN_DIR) --build-temp $(ASAN_DIR)/tmp --force

test-asan: asan
	@rm -rf $(ASAN_DIR)/reports && mkdir -p $(ASAN_DIR)/reports
	@reports=$(abspath $(ASAN_DIR))/reports; \
	DNSPROBE_NATIVE_DIR=$(abspath $(ASAN_DIR)) LD_PRELOAD=$$(clang -print-file-name=libclang_rt.asan-x86_64.so) \
	  PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0:log_path=$$reports/asan \
	  UBSAN_OPTIONS=print_stacktrace=1:log_path=$$reports/ubsan $(PY) -m pytest -q $(ASAN_TESTS); rc=$$?; \
	if ls $$reports | grep -q .; then echo "== sanitizer reports ($$reports):"; cat $$reports/*; exit 1; fi; \
	exit $$rc

# The tests that drive the C extensions directly: what CI runs under the sanitizers (make test-asan: all of them).
ASAN_CI_TESTS := tests/decode/test_fastwire.py tests/export/test_columns.py \
	tests/export/test_cdns_block.py tests/capture/test_pcap_records.py tests/run/test_native_build.py \
	tests/decode/test_decoderec.py tests/match/test_matchrec.py tests/export/test_parquetrec.py \
	tests/export/test_cdnsrec.py tests/capture/test_ring.py tests/capture/test_packed_frames.py tests/capture/test_dnstaprecv.py \
	tests/decode/test_dnstap_c.py tests/decode/test_tcpstream_c.py \
	tests/export/test_lookup.py tests/export/test_psl.py tests/export/test_enrich.py tests/export/test_answers.py \
	tests/export/test_topk.py tests/run/test_dpdk_safety.py tests/match/test_semantics.py

test-asan-ci:
	$(MAKE) test-asan ASAN_TESTS="$(ASAN_CI_TESTS)"

# Coverage-guided fuzzing with atheris (fuzz/fuzz_*.py, one per entry point that takes untrusted bytes): the
# extensions built by clang with ASan, UBSan and libFuzzer's coverage into build/fuzz, atheris' ASan+libFuzzer
# runtime preloaded. Each harness starts from its seeds (fuzz/corpus/NAME, read only) and keeps what it finds
# in build/fuzz/corpus/NAME; a crash or a C/Python difference stops the run, its input in build/fuzz/crashes.
# FUZZ_PYTHON_COVERAGE=0 (in the environment) guides by the C coverage alone, several times faster (fuzz/harness.py).
FUZZ_DIR := build/fuzz
FUZZ_SECONDS ?= 30
# (fuzz_dpdk only where the DPDK extension is built: libdpdk found by pkg-config, as setup.py decides)
FUZZ_HARNESSES := $(filter-out $(if $(shell pkg-config --exists libdpdk 2>/dev/null && echo y),,fuzz_dpdk),\
	$(basename $(notdir $(wildcard fuzz/fuzz_*.py))))

fuzz-deps: venv
	@bash contrib/install-deps.sh sanitizers
	@$(PY) -c 'import atheris' 2>/dev/null || $(PY) -m pip install -q -e '.[fuzz]'

fuzz-build: fuzz-deps
	rm -rf $(FUZZ_DIR)/lib && mkdir -p $(FUZZ_DIR)/crashes
	CC=clang LDSHARED="clang -shared" CFLAGS="$(SANITIZE) -fsanitize=fuzzer-no-link -g" \
	  $(PY) setup.py -q build_ext --build-lib $(FUZZ_DIR)/lib --build-temp $(FUZZ_DIR)/tmp --force

fuzz: fuzz-build
	@runtime=$$($(PY) -c 'import atheris, os; print(os.path.dirname(os.path.dirname(atheris.__file__)))'); \
	for h in $(FUZZ_HARNESSES); do \
	  mkdir -p $(FUZZ_DIR)/corpus/$$h; echo "== $$h ($(FUZZ_SECONDS) s)"; \
	  DNSPROBE_NATIVE_DIR=$(abspath $(FUZZ_DIR))/lib LD_PRELOAD=$$runtime/asan_with_fuzzer.so PYTHONMALLOC=malloc \
	  ASAN_OPTIONS=detect_leaks=0 $(PY) fuzz/$$h.py -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=4096 \
	    -artifact_prefix=$(FUZZ_DIR)/crashes/$$h- $(FUZZ_DIR)/corpus/$$h fuzz/corpus/$$h 2>&1 \
	    | grep -v '^INFO: Instrumenting' | tail -n 4 | tee $(FUZZ_DIR)/$$h.log; \
	  grep -q '^Done [0-9]* runs' $(FUZZ_DIR)/$$h.log || { echo "$$h found something: $(FUZZ_DIR)/crashes"; exit 1; }; \
	done

fuzz-ci:
	$(MAKE) fuzz FUZZ_SECONDS=20

# After a campaign: the seeds and what it found merged into fuzz/corpus/NAME, minimised by libFuzzer's -merge=1
# (an input is kept when it adds a C coverage edge: hit counts left out, so that the corpus stays small); the
# regression-* inputs of findings are kept whatever they add.
fuzz-merge: fuzz-build
	@runtime=$$($(PY) -c 'import atheris, os; print(os.path.dirname(os.path.dirname(atheris.__file__)))'); \
	for h in $(FUZZ_HARNESSES); do \
	  rm -rf $(FUZZ_DIR)/merged/$$h && mkdir -p $(FUZZ_DIR)/merged/$$h $(FUZZ_DIR)/corpus/$$h; \
	  cp fuzz/corpus/$$h/regression-* $(FUZZ_DIR)/merged/$$h/ 2>/dev/null; \
	  FUZZ_PYTHON_COVERAGE=0 DNSPROBE_NATIVE_DIR=$(abspath $(FUZZ_DIR))/lib LD_PRELOAD=$$runtime/asan_with_fuzzer.so \
	  PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0 $(PY) fuzz/$$h.py -merge=1 -use_counters=0 -rss_limit_mb=4096 \
	    $(FUZZ_DIR)/merged/$$h fuzz/corpus/$$h $(FUZZ_DIR)/corpus/$$h > $(FUZZ_DIR)/$$h.merge.log 2>&1 \
	    || { echo "$$h: merge failed ($(FUZZ_DIR)/$$h.merge.log)"; exit 1; }; \
	  echo "$$h: $$(ls fuzz/corpus/$$h | wc -l) seeds + $$(ls $(FUZZ_DIR)/corpus/$$h | wc -l) found -> $$(ls $(FUZZ_DIR)/merged/$$h | wc -l)"; \
	  rm -rf fuzz/corpus/$$h && cp -r $(FUZZ_DIR)/merged/$$h fuzz/corpus/$$h; \
	done; du -sh fuzz/corpus

# Line and branch coverage of each C file by the corpora (seeds and what make fuzz found): the extensions built
# with clang's source-based coverage into build/fuzz/cov, every corpus input run once (-runs=0), llvm-cov report.
fuzz-coverage: fuzz-deps
	rm -rf $(FUZZ_DIR)/cov && mkdir -p $(FUZZ_DIR)/cov/profiles
	CC=clang LDSHARED="clang -shared" CFLAGS="-fprofile-instr-generate -fcoverage-mapping -g" \
	  LDFLAGS="-fprofile-instr-generate" \
	  $(PY) setup.py -q build_ext --build-lib $(FUZZ_DIR)/cov/lib --build-temp $(FUZZ_DIR)/cov/tmp --force
	@for h in $(FUZZ_HARNESSES); do mkdir -p $(FUZZ_DIR)/corpus/$$h; \
	  DNSPROBE_NATIVE_DIR=$(abspath $(FUZZ_DIR))/cov/lib \
	  LLVM_PROFILE_FILE=$(abspath $(FUZZ_DIR))/cov/profiles/$$h-%p.profraw \
	  $(PY) fuzz/$$h.py -runs=0 $(FUZZ_DIR)/corpus/$$h fuzz/corpus/$$h >/dev/null 2>&1 || exit 1; done
	@llvm=$$(dirname $$(readlink -f $$(command -v clang))); \
	$$llvm/llvm-profdata merge -sparse $(FUZZ_DIR)/cov/profiles/*.profraw -o $(FUZZ_DIR)/cov/all.profdata && \
	$$llvm/llvm-cov report -instr-profile=$(FUZZ_DIR)/cov/all.profdata \
	  $$(find $(FUZZ_DIR)/cov/lib -name '*.so' -printf ' -object %p') \
	  | tee $(FUZZ_DIR)/coverage.txt

clean:
	rm -rf $(VENV) $(DEMO_OUT) benchmarks/cache build
