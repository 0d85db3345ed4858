"""Block-partitioned objectives for the asynchronous optimizers: a flat parameter vector cut
into one block per stage, stochastic gradients on numbered mini-batches, the full objective.

- ``quadratic``: least squares on a random Gaussian design, realizable (f* = 0), as the paper;
- ``logistic``: L2-regularized logistic regression on a synthetic, nearly separable data set;
- ``char_lm``: a small character-level transformer LM (torch), one block per layer group,
  trained on the text of the Python documentation that ships with the standard library
  (`pydoc_data.topics`); nothing is downloaded.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from octopipe.asynchronous.char_lm import char_lm
from octopipe.errors import ConfigError

OBJECTIVES = ("quadratic", "logistic", "char_lm")


class Objective(Protocol):
    """What an optimizer needs: blocks, batches, gradients and values, L and f*."""

    name: str
    blocks: tuple[slice, ...]
    n_batches: int
    smoothness: float
    f_star: float

    def init(self) -> np.ndarray: ...
    def grad(self, w: np.ndarray, batch: int) -> np.ndarray: ...
    def value(self, w: np.ndarray) -> float: ...
    def full_grad(self, w: np.ndarray) -> np.ndarray: ...


def even_blocks(d: int, n_stages: int) -> tuple[slice, ...]:
    """`n_stages` contiguous slices of a d-vector, sizes differing by at most one."""
    if n_stages < 1 or n_stages > d:
        raise ConfigError(f"stages must be in 1..{d} for a {d}-parameter objective, got {n_stages}")
    cuts = np.linspace(0, d, n_stages + 1).round().astype(int)
    return tuple(slice(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:]))


@dataclass(frozen=True, eq=False)
class Quadratic:
    """f(w) = (1/2n)·||Xw - y||² with y = X·w_true (f* = 0); batches of `batch` rows."""

    X: np.ndarray
    y: np.ndarray
    blocks: tuple[slice, ...]
    batch: int
    name: str = "quadratic"
    f_star: float = 0.0
    smoothness: float = field(init=False)

    def __post_init__(self) -> None:
        n = self.X.shape[0]
        object.__setattr__(self, "smoothness", float(np.linalg.eigvalsh(self.X.T @ self.X / n).max()))

    @property
    def n_batches(self) -> int:
        return self.X.shape[0] // self.batch

    def init(self) -> np.ndarray:
        return np.zeros(self.X.shape[1])

    def _rows(self, batch: int) -> slice:
        return slice(batch * self.batch, (batch + 1) * self.batch)

    def grad(self, w: np.ndarray, batch: int) -> np.ndarray:
        Xb, yb = self.X[self._rows(batch)], self.y[self._rows(batch)]
        return Xb.T @ (Xb @ w - yb) / len(yb)

    def value(self, w: np.ndarray) -> float:
        r = self.X @ w - self.y
        return float(0.5 * r @ r / len(r))

    def full_grad(self, w: np.ndarray) -> np.ndarray:
        return self.X.T @ (self.X @ w - self.y) / len(self.y)


def quadratic(n_stages: int, d: int = 512, n_batches: int = 60, batch: int = 10,
              seed: int = 0) -> Quadratic:
    """The paper's random quadratic: Gaussian X (n = batch·n_batches rows), y = X·w_true."""
    rng = np.random.default_rng(seed)
    n = batch * n_batches
    X = rng.normal(size=(n, d))
    y = X @ rng.normal(size=d)
    return Quadratic(X, y, even_blocks(d, n_stages), batch)


@dataclass(frozen=True, eq=False)
class Logistic:
    """f(w) = mean log(1 + exp(-y·x·w)) + (lam/2)·||w||², labels in {-1, +1}."""

    X: np.ndarray
    y: np.ndarray
    lam: float
    blocks: tuple[slice, ...]
    batch: int
    f_star: float
    name: str = "logistic"
    smoothness: float = field(init=False)

    def __post_init__(self) -> None:
        n = self.X.shape[0]
        L = 0.25 * float(np.linalg.eigvalsh(self.X.T @ self.X / n).max()) + self.lam
        object.__setattr__(self, "smoothness", L)

    @property
    def n_batches(self) -> int:
        return self.X.shape[0] // self.batch

    def init(self) -> np.ndarray:
        return np.zeros(self.X.shape[1])

    def _grad_on(self, X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
        m = y * (X @ w)
        s = -y * _sigmoid(-m)
        return X.T @ s / len(y) + self.lam * w

    def grad(self, w: np.ndarray, batch: int) -> np.ndarray:
        rows = slice(batch * self.batch, (batch + 1) * self.batch)
        return self._grad_on(self.X[rows], self.y[rows], w)

    def value(self, w: np.ndarray) -> float:
        m = self.y * (self.X @ w)
        return float(np.mean(np.logaddexp(0.0, -m)) + 0.5 * self.lam * w @ w)

    def full_grad(self, w: np.ndarray) -> np.ndarray:
        return self._grad_on(self.X, self.y, w)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def logistic(n_stages: int, d: int = 512, n_batches: int = 100, batch: int = 10,
             lam: float = 1e-4, seed: int = 0) -> Logistic:
    """Gaussian features, labels sign(x·w_true + noise) with 5% label noise (nearly separable);
    f* from a long full-gradient run (Nesterov, step 1/L) on the regularized problem."""
    rng = np.random.default_rng(seed)
    n = batch * n_batches
    X = rng.normal(size=(n, d)) / np.sqrt(d)
    w_true = rng.normal(size=d)
    y = np.sign(X @ w_true + 0.1 * rng.normal(size=n))
    flip = rng.random(n) < 0.05
    y[flip] = -y[flip]
    y[y == 0] = 1.0
    probe = Logistic(X, y, lam, even_blocks(d, n_stages), batch, 0.0)
    return Logistic(X, y, lam, even_blocks(d, n_stages), batch, nesterov_minimum(probe))


def nesterov_minimum(obj: Logistic, steps: int = 1000) -> float:
    """f* of a smooth convex objective by Nesterov's accelerated gradient (the best value seen)."""
    L = obj.smoothness
    w = v = obj.init()
    best = obj.value(w)
    for t in range(steps):
        w_next = v - obj.full_grad(v) / L
        v = w_next + (t / (t + 3)) * (w_next - w)
        w = w_next
        best = min(best, obj.value(w))
    return best


def make_objective(name: str, n_stages: int, seed: int = 0):
    """The objective `name` (OBJECTIVES) cut into `n_stages` blocks."""
    if name == "quadratic":
        return quadratic(n_stages, seed=seed)
    if name == "logistic":
        return logistic(n_stages, seed=seed)
    if name == "char_lm":
        return char_lm(n_stages, seed=seed)
    raise ConfigError(f"objective={name!r} is unknown; valid: {', '.join(OBJECTIVES)}")


__all__ = ["OBJECTIVES", "Logistic", "Objective", "Quadratic", "even_blocks", "logistic",
           "make_objective", "quadratic"]
