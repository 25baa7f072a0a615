"""Callbacks of the RL trainer."""

from __future__ import annotations

import lightning as L
from tqdm.auto import tqdm


class UpdateProgress(L.Callback):
    """One progress bar over all updates (each Lightning epoch is one update)."""

    def __init__(self, total_updates: int):
        self.total_updates = total_updates
        self.bar: tqdm | None = None

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self.bar = tqdm(
                total=self.total_updates, initial=trainer.current_epoch, desc="MPT", unit="update"
            )

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if self.bar is None:
            return
        last = module.history[-1] if module.history else {}  # a SwarmModule's
        kind = "bid" if last.get("update_is_bid") else "action"
        self.bar.set_postfix(kind=kind, reward=f"{last.get('reward/mean', float('nan')):.1f}")
        self.bar.update(1)

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if self.bar is not None:
            self.bar.close()
