"""One training run: its phases, and what they need around them.

| module | what it holds |
|---|---|
| ``phases`` | :class:`~bidswarm.run.phases.Run`: start, cold start, evaluate, fit, finish |
| ``preflight`` | every check before a folder, a model or an env is made; Hydra's callback |
| ``resume`` | what ``resume=`` and ``init_from=`` must name; the run folder, ``state.json`` |
| ``build`` | the run's population and its rollout loop (also used by ``bidswarm.evaluate``) |
| ``demonstrations`` | the experts' demonstrations: SFT data, the action-token limit |
| ``recording`` | the MLflow logger, artifacts, transcripts, trained agents, the summary |
| ``threads`` | the torch threads of a run: a parallel local sweep's jobs share the cores |

Everything a resumed (or DDP child) process needs to pick the run up again lives in the run
folder: ``state.json`` (phases done, held-out results, MLflow run id), ``sft/`` (the population
after the cold start; LoRA agents: their adapters, on the frozen base in ``base/``),
``checkpoints/last.ckpt`` (agents or their LoRA adapters, optimizer, RNG, schedule position,
counters, MLflow run id). Both files are replaced atomically, so a kill at any moment leaves
the last complete ones (docs/reliability.md).
"""
