"""Train a swarm with MPT (or a baseline): SFT cold start, RL, held-out evaluation.

python -m bidswarm.train                       # the default: tiny model, iron pickaxe
python -m bidswarm.train debug=smoke           # the whole pipeline in under a minute
python -m bidswarm.train -m ablation=random_credit,round_robin seed=0,1,2
"""

from __future__ import annotations

import sys

import hydra
import lightning as L
import torch
from omegaconf import DictConfig

from bidswarm.config import register_configs, validate
from bidswarm.run import Run

register_configs()


def train(cfg: DictConfig) -> dict[str, float]:
    """The whole job; returns the held-out metrics after RL (or before, if RL is off)."""
    run = Run.start(cfg)
    try:
        if not run.state.get("sft_done"):
            run.cold_start()
        if cfg.eval.enabled and cfg.eval.before_rl and "eval_before" not in run.state:
            run.evaluate_and_record("eval_before")
        if not run.fit():
            print(f"[bidswarm] stopped early; continue with resume={run.run_dir}", flush=True)
            run.close(status="FINISHED")
            return {}
        result = run.evaluate_and_record("eval_after") if cfg.eval.enabled else {}
        run.finish()
    except BaseException:
        run.close(status="FAILED")
        raise
    run.close(status="FINISHED")
    return result


@hydra.main(version_base="1.3", config_path="../../conf", config_name="train")
def main(cfg: DictConfig) -> float:
    validate(cfg)
    if cfg.model.torch_threads:
        torch.set_num_threads(cfg.model.torch_threads)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    result = train(cfg)
    return result.get("reward/mean", float("nan"))


if __name__ == "__main__":
    sys.exit(main())
