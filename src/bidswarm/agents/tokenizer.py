"""A small tokenizer trained on a task's own text, for the ``tiny`` models trained from scratch.

A tiny model learns fastest when prompts are short, so each word, number (``12``, ``0.6``) and
punctuation mark of the task becomes one token where the vocabulary allows. Spaces are kept as a
``▁`` prefix of the next piece (SentencePiece's Metaspace), so decoding gives back the exact text.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN]

SPACE = "▁"
# One pre-token: an optional space marker, then a number (digits, optional decimals), a word,
# or one other character; a lone space marker (repeated spaces) stands alone. Text between
# matches (newlines, tabs) is kept as its own piece by the "isolated" split.
PIECE_PATTERN = rf"{SPACE}?(?:\d+(?:\.\d+)?|[A-Za-z_]+|[^\s{SPACE}A-Za-z_\d])|{SPACE}"


def build_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a BPE tokenizer on ``texts`` with ``<pad> <s> </s> <unk>`` special tokens.

    Printable ASCII is always in the alphabet, so any ASCII text round-trips; characters never
    seen map to ``<unk>``. The returned tokenizer pads on the left (batched generation) and
    does not add ``<s>`` by itself: prompt templates decide where special tokens go.
    """
    if not texts:
        raise ValueError("build_tokenizer needs a non-empty corpus of the task's text")
    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="never", split=False),
            pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated"),
        ]
    )
    tokenizer.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="never", split=False)
    alphabet = sorted(set(string.printable) - set(string.whitespace) | {"\n", "\t", SPACE})
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=alphabet,
        min_frequency=1,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    return fast
