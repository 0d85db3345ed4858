"""Text to token ids: byte-level (the default: each UTF-8 byte is a token, vocabulary 256) or a
byte-level BPE trained on the corpus itself to the model's vocabulary (`train.tokenizer=bpe`,
the `tokenizers` package, installed with the hf extra)."""
from __future__ import annotations

import importlib

import numpy as np

from octopipe.errors import ConfigError

CHUNK = 1 << 16


def byte_tokens(data: np.ndarray, vocab: int) -> np.ndarray:
    if vocab < 256:
        raise ConfigError(f"model vocab={vocab}: byte-level tokens need a vocabulary of at least 256 "
                          f"(or train.tokenizer=bpe)")
    return data


def bpe_tokens(data: np.ndarray, vocab: int) -> np.ndarray:
    """The corpus through a byte-level BPE of `vocab` tokens trained on it (deterministic)."""
    try:
        tk = importlib.import_module("tokenizers")      # optional: only train.tokenizer=bpe needs it
    except ImportError as e:
        raise ConfigError("train.tokenizer=bpe needs the tokenizers package: pip install 'octopipe[hf]'") from e
    Tokenizer, models, pre_tokenizers, trainers = tk.Tokenizer, tk.models, tk.pre_tokenizers, tk.trainers
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab < len(alphabet) + 1:
        raise ConfigError(f"train.tokenizer=bpe: model.vocab={vocab} leaves no room for merges: a byte-level BPE "
                          f"starts from {len(alphabet)} byte symbols; set model.vocab above {len(alphabet)} "
                          f"(e.g. 512)")
    text = bytes(data).decode("utf-8")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=alphabet, show_progress=False)
    chunks = [text[i:i + CHUNK] for i in range(0, len(text), CHUNK)]
    tok.train_from_iterator(chunks, trainer)
    ids = [i for enc in tok.encode_batch(chunks) for i in enc.ids]
    return np.asarray(ids, dtype=np.int64)


def tokenize(data: np.ndarray, kind: str, vocab: int) -> np.ndarray:
    """`data` (the corpus's bytes) as token ids below `vocab`."""
    if kind == "bpe":
        return bpe_tokens(data, vocab)
    return byte_tokens(data, vocab)
