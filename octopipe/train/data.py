"""Training data: a local text file or directory as byte-level tokens, cut into deterministic
micro-batches.

The default corpus ships with Python: the text of the standard library's `pydoc_data.topics`
(the language reference's help topics, about 0.47 MB of English and code), so the default run
needs no download. Micro-batch `mb` of step `step` is `micro_batch_size` windows of
`seq_len + 1` bytes at offsets drawn from a generator seeded by (seed, step, mb) alone: the same
on every run and every rank, whatever the plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from pydoc_data.topics import topics

import numpy as np
import torch

from octopipe.errors import ConfigError
from octopipe.io import regular_file

BYTE_VOCAB = 256
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".json", ".csv", ".html", ".tex", "")


def default_corpus_text() -> str:
    """The standard library's help topics as one text (ships with every CPython)."""
    return "\n\n".join(topics[k] for k in sorted(topics))


def _read_text(path: Path, max_bytes: int) -> bytes:
    regular_file(path, "train.corpus", max_bytes, "train.max_corpus_mb")
    data = path.read_bytes()
    if b"\x00" in data[:65536]:
        raise ConfigError(f"train.corpus={path}: a binary file (NUL bytes); give a text file")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"train.corpus={path}: not UTF-8 text (byte {e.start}); give a text file") from e
    return data


def load_corpus(corpus: str, max_mb: float = 256.0) -> np.ndarray:
    """The corpus as uint8 byte tokens: "" = the default (pydoc_data's topics), a text file, or
    every text file below a directory in sorted order. ConfigError for a path that does not
    exist, is no regular file (a FIFO, a device), is larger than `max_mb` megabytes in all, is
    empty or binary: checked before anything is read."""
    limit = int(max_mb * 1e6)
    if not corpus:
        data = default_corpus_text().encode("utf-8")
    else:
        path = Path(corpus).expanduser()
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES
                           and not any(part.startswith(".") for part in p.relative_to(path).parts))
            if not files:
                raise ConfigError(f"train.corpus={corpus}: the directory holds no text files")
            total = sum(p.stat().st_size for p in files)
            if total > limit:
                raise ConfigError(f"train.corpus={corpus}: {total / 1e6:.1f} MB of text files, above the "
                                  f"{max_mb:g} MB limit (train.max_corpus_mb); give less text or raise "
                                  f"train.max_corpus_mb")
            data = b"\n".join(_read_text(p, limit) for p in files)
        else:
            data = _read_text(path, limit)
    if not data.strip():
        raise ConfigError(f"train.corpus={corpus or '(default)'}: empty")
    return np.frombuffer(data, dtype=np.uint8).copy()


@dataclass(frozen=True)
class TokenBatches:
    """Deterministic micro-batches of `tokens`: `batch(step, mb)` -> {'ids', 'targets'} int64
    [micro_batch_size, seq_len], targets being ids shifted by one token."""

    tokens: np.ndarray = field(repr=False)
    seq_len: int
    micro_batch_size: int
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.tokens) < self.seq_len + 2:
            raise ConfigError(f"train.corpus: {len(self.tokens)} tokens, fewer than one sequence of "
                              f"{self.seq_len + 1}; give a longer text or a shorter model.seq_len")

    def offsets(self, step: int, mb: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, step, mb])
        return rng.integers(0, len(self.tokens) - self.seq_len - 1, size=self.micro_batch_size)

    def batch(self, step: int, mb: int) -> dict:
        rows = np.stack([self.tokens[o:o + self.seq_len + 1] for o in self.offsets(step, mb)])
        t = torch.from_numpy(rows.astype(np.int64))
        return {"ids": t[:, :-1], "targets": t[:, 1:]}
