"""What a training run shows on the console: our own lines (``[bidswarm] ...``) and progress
bars. Library chatter (Lightning's banners and tips, MLflow's store set-up, warnings) goes to
the run's ``train.log`` only, unless ``verbose=true``; our lines go to both.

Hydra's job logging gives the root logger a console handler and a file handler
(``<run folder>/train.log``); this module decides what reaches each.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys

LIBRARY_LOGGERS = (
    "lightning",
    "lightning.pytorch",
    "lightning.fabric",
    "mlflow",
    "alembic",
    "transformers",
)
"""Loggers whose INFO lines (banners, tips, "GPU available", store migrations) are chatter."""
OURS = "bidswarm"

_log = logging.getLogger(OURS)


def say(text: str) -> None:
    """One of our lines: on the console and in the run's ``train.log``."""
    if _log.handlers:
        _log.info(text)
    else:  # :func:`configure` was not called (a library user's own script)
        print(text, flush=True)


def _console_handlers(logger: logging.Logger) -> list[logging.Handler]:
    return [
        h
        for h in logger.handlers
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]


class ToFilesOnly(logging.Filter):
    """Hands a logger's records to ``files`` and keeps them off the logger's own handlers: for
    loggers that install a console handler when first imported (DeepSpeed's, which warns about
    the accelerator on import), after :func:`configure` ran."""

    def __init__(self, files: list[logging.Handler]):
        super().__init__()
        self.files = files

    def filter(self, record: logging.LogRecord) -> bool:
        for handler in self.files:
            if record.levelno >= handler.level:
                handler.handle(record)
        return False


LATE_LOGGERS = ("DeepSpeed",)
"""Loggers made with their own console handler on import, possibly after :func:`configure`."""


def configure(verbose: bool) -> None:
    """Route our lines and the libraries' (call once per process, after Hydra set up logging
    and before models, trainers or the tracking store are made)."""
    import transformers

    if importlib.util.find_spec("mlflow"):  # absent where only logger=csv is used
        import mlflow  # noqa: F401  (it configures its loggers on import: do that first)

    root = logging.getLogger()
    files = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
    _log.handlers.clear()
    _log.propagate = False
    _log.setLevel(logging.INFO)
    plain = logging.StreamHandler(sys.stdout)
    plain.setFormatter(logging.Formatter("%(message)s"))
    _log.addHandler(plain)
    for handler in files:
        _log.addHandler(handler)
    if verbose:
        return
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for handler in _console_handlers(logger):
            logger.removeHandler(handler)
        logger.propagate = True  # -> the root's train.log
    for name in LATE_LOGGERS:
        logging.getLogger(name).addFilter(ToFilesOnly(files))
    for handler in _console_handlers(root):
        handler.setLevel(logging.ERROR)
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    logging.captureWarnings(True)  # warnings -> logger "py.warnings" -> train.log
    transformers.utils.logging.disable_progress_bar()  # "Writing model shards" per save
