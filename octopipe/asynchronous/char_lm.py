"""A small character-level transformer LM as a block-partitioned objective (torch, CPU, fp32).

One transformer layer per stage; stage 0 also holds the token and position embeddings, the last
stage the final norm and the output head. The text is the Python documentation shipped with
the standard library (`pydoc_data.topics`), so nothing is downloaded. The objective's value is
the mean training cross-entropy (nats per character) on a fixed set of its batches.
"""
from __future__ import annotations

import pydoc_data.topics
from dataclasses import dataclass, field

import numpy as np

from octopipe.errors import ConfigError


def corpus(n_chars: int = 200_000) -> str:
    """The first `n_chars` characters of the stdlib's pydoc topics, in key order."""
    topics = pydoc_data.topics.topics
    return "".join(topics[k] for k in sorted(topics))[:n_chars]


@dataclass(frozen=True)
class Shape:
    vocab: int
    d: int
    seq: int
    layers: int

    def layer_sizes(self) -> list[tuple[str, tuple[int, ...]]]:
        d = self.d
        return [("ln1_g", (d,)), ("ln1_b", (d,)), ("qkv", (d, 3 * d)), ("proj", (d, d)),
                ("ln2_g", (d,)), ("ln2_b", (d,)), ("fc1", (d, 4 * d)), ("fc2", (4 * d, d))]

    def layout(self) -> list[list[tuple[str, tuple[int, ...]]]]:
        """Per stage (= layer) the named tensors it holds, in flat order."""
        out = []
        for s in range(self.layers):
            names = [(f"{n}{s}", shp) for n, shp in self.layer_sizes()]
            if s == 0:
                names = [("tok", (self.vocab, self.d)), ("pos", (self.seq, self.d))] + names
            if s == self.layers - 1:
                names += [("lnf_g", (self.d,)), ("lnf_b", (self.d,)), ("head", (self.d, self.vocab))]
            out.append(names)
        return out


@dataclass(frozen=True, eq=False)
class CharLM:
    """The LM objective; `offsets[b]` are the start positions of batch b's sequences."""

    shape: Shape
    data: np.ndarray          # the text as int64 character ids
    offsets: np.ndarray       # [n_batches, batch]
    eval_batches: int
    seed: int
    name: str = "char_lm"
    f_star: float = 0.0
    blocks: tuple[slice, ...] = field(init=False)
    smoothness: float = field(init=False)

    def __post_init__(self) -> None:
        sizes = [sum(int(np.prod(shp)) for _, shp in stage) for stage in self.shape.layout()]
        cuts = np.concatenate([[0], np.cumsum(sizes)])
        object.__setattr__(self, "blocks", tuple(slice(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])))
        object.__setattr__(self, "smoothness", self._estimate_smoothness())

    @property
    def n_batches(self) -> int:
        return len(self.offsets)

    @property
    def dim(self) -> int:
        return self.blocks[-1].stop

    def init(self) -> np.ndarray:
        """GPT-2-style init: normal(0, 0.02) matrices, unit norm gains, zero biases."""
        rng = np.random.default_rng(self.seed)
        parts = []
        for stage in self.shape.layout():
            for name, shp in stage:
                if name.startswith("ln"):
                    parts.append(np.full(shp, 1.0 if "_g" in name else 0.0).ravel())
                else:
                    parts.append(rng.normal(0.0, 0.02, size=shp).ravel())
        return np.concatenate(parts)

    def _loss(self, w, batches):
        import torch  # heavy: only the LM objective needs it
        shp = self.shape
        t = {}
        pos = 0
        for stage in shp.layout():
            for name, size in stage:
                n = int(np.prod(size))
                t[name] = w[pos:pos + n].view(size)
                pos += n
        idx = torch.from_numpy(np.stack([self.data[o:o + shp.seq + 1]
                                         for b in batches for o in self.offsets[b]]))
        x, target = idx[:, :-1], idx[:, 1:]
        h = t["tok"][x] + t["pos"][: shp.seq]
        heads, d = 2, shp.d
        for s in range(shp.layers):
            a = torch.nn.functional.layer_norm(h, (d,), t[f"ln1_g{s}"], t[f"ln1_b{s}"])
            q, k, v = (a @ t[f"qkv{s}"]).split(d, dim=-1)
            q, k, v = (z.view(z.shape[0], shp.seq, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).reshape(h.shape)
            h = h + y @ t[f"proj{s}"]
            a = torch.nn.functional.layer_norm(h, (d,), t[f"ln2_g{s}"], t[f"ln2_b{s}"])
            h = h + torch.nn.functional.gelu(a @ t[f"fc1{s}"]) @ t[f"fc2{s}"]
        h = torch.nn.functional.layer_norm(h, (d,), t["lnf_g"], t["lnf_b"])
        logits = h @ t["head"]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, shp.vocab), target.reshape(-1))

    def _grad_on(self, w: np.ndarray, batches) -> tuple[float, np.ndarray]:
        import torch  # heavy: only the LM objective needs it
        wt = torch.tensor(w, dtype=torch.float32, requires_grad=True)
        loss = self._loss(wt, batches)
        loss.backward()
        return float(loss.detach()), wt.grad.numpy().astype(np.float64)

    def grad(self, w: np.ndarray, batch: int) -> np.ndarray:
        return self._grad_on(w, [batch])[1]

    def value(self, w: np.ndarray) -> float:
        import torch  # heavy: only the LM objective needs it
        with torch.no_grad():
            return float(self._loss(torch.tensor(w, dtype=torch.float32), range(self.eval_batches)))

    def full_grad(self, w: np.ndarray) -> np.ndarray:
        return self._grad_on(w, range(self.eval_batches))[1]

    def _estimate_smoothness(self, pairs: int = 3, radius: float = 1e-2) -> float:
        """max ||grad f(u) - grad f(v)|| / ||u - v|| over a few random pairs around the init
        (an estimate: the LM is not globally smooth with a known constant)."""
        rng = np.random.default_rng(self.seed + 1)
        w = self.init()
        best = 0.0
        for _ in range(pairs):
            delta = rng.normal(size=w.shape)
            delta *= radius / np.linalg.norm(delta)
            g1, g2 = self.full_grad(w), self.full_grad(w + delta)
            best = max(best, float(np.linalg.norm(g1 - g2) / radius))
        return best


def char_lm(n_stages: int, d: int = 32, seq: int = 32, batch: int = 8, n_batches: int = 256,
            seed: int = 0) -> CharLM:
    """The LM with one transformer layer per stage on the stdlib's pydoc text."""
    text = corpus()
    chars = sorted(set(text))
    lookup = {c: i for i, c in enumerate(chars)}
    ids = np.array([lookup[c] for c in text], dtype=np.int64)
    rng = np.random.default_rng(seed)
    offsets = rng.integers(0, len(ids) - seq - 1, size=(n_batches, batch))
    if n_stages < 1:
        raise ConfigError(f"char_lm: stages must be at least 1, got {n_stages}")
    return CharLM(Shape(len(chars), d, seq, n_stages), ids, offsets, eval_batches=16, seed=seed)


__all__ = ["CharLM", "char_lm", "corpus"]
