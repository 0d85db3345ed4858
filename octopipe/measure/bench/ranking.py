"""Do the simulator and the measurement order schedules alike, where the measurement can tell?

A measured median carries noise: on a shared machine the iterations of one schedule spread
over a range (its interquartile range here). Two schedules whose predicted times differ by less
than that spread cannot be ranked by the measurement, so besides Spearman's rank correlation over
all schedules, each pair is marked separated (predicted gap larger than the larger of the two
measured spreads) or within noise, and the ranking is also judged on the separated pairs alone
and on the largest chain of mutually separated schedules.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import combinations

import numpy as np


@dataclass(frozen=True)
class Spread:
    median: float
    q25: float
    q75: float
    n: int

    @property
    def iqr(self) -> float:
        return self.q75 - self.q25

    @property
    def relative(self) -> float:
        """Interquartile range over the median."""
        return self.iqr / self.median if self.median > 0 else float("inf")


def spread(samples: Sequence[float]) -> Spread:
    """Median and quartiles of measured iteration times."""
    x = np.asarray(samples, dtype=np.float64)
    q25, med, q75 = np.percentile(x, [25, 50, 75])
    return Spread(float(med), float(q25), float(q75), len(x))


def ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank."""
    v = np.asarray(values, dtype=np.float64)
    order = np.argsort(v, kind="stable")
    r = np.empty(len(v))
    r[order] = np.arange(1, len(v) + 1)
    for x in np.unique(v):
        tie = v == x
        r[tie] = r[tie].mean()
    return r


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson on tie-averaged ranks); 1.0 for fewer than 2 items,
    nan when one side is all ties."""
    if len(a) < 2:
        return 1.0
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(np.sqrt((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    predicted_gap_s: float       # |simulated a - simulated b|
    noise_s: float               # the larger measured interquartile range of the two
    separated: bool              # predicted gap > noise
    same_order: bool             # measured and simulated put a and b in the same order
    paired_diff_s: float | None = None    # median over rounds of (a's round median - b's)
    paired_noise_s: float | None = None   # interquartile range of those per-round differences
    separated_paired: bool | None = None  # predicted gap > paired noise
    same_order_paired: bool | None = None  # the paired difference has the simulated sign


def round_medians(samples: Sequence[float], per_round: int) -> np.ndarray:
    """The median of each round's `per_round` consecutive samples."""
    x = np.asarray(samples, dtype=np.float64)
    return np.median(x[: len(x) // per_round * per_round].reshape(-1, per_round), axis=1)


def pairs(names: Sequence[str], measured: Sequence[float], noise: Sequence[float],
          simulated: Sequence[float], samples: Sequence[Sequence[float]] | None = None,
          per_round: int = 1) -> list[Pair]:
    """Every pair of schedules, with whether the measurement can separate it and whether the two
    orders agree on it; with `samples` (each schedule's measured iterations, round by round,
    `per_round` a round), also the paired per-round comparison."""
    out = []
    for i, j in combinations(range(len(names)), 2):
        gap = abs(simulated[i] - simulated[j])
        nz = max(noise[i], noise[j])
        sim_sign = np.sign(simulated[i] - simulated[j])
        same = np.sign(measured[i] - measured[j]) == sim_sign
        extra = {}
        if samples is not None:
            d = round_medians(samples[i], per_round) - round_medians(samples[j], per_round)
            q25, med, q75 = np.percentile(d, [25, 50, 75])
            extra = dict(paired_diff_s=float(med), paired_noise_s=float(q75 - q25),
                         separated_paired=bool(gap > q75 - q25), same_order_paired=bool(np.sign(med) == sim_sign))
        out.append(Pair(names[i], names[j], float(gap), float(nz), bool(gap > nz), bool(same), **extra))
    return out


def separated_chain(names: Sequence[str], simulated: Sequence[float], noise: Sequence[float]) -> list[str]:
    """The largest set of schedules every pair of which is separated (predicted gap larger than
    either measured spread), in simulated order; by exhaustive search (a handful of schedules),
    the first such set in name order when several are as large."""
    def ok(group) -> bool:
        return all(abs(simulated[i] - simulated[j]) > max(noise[i], noise[j]) for i, j in combinations(group, 2))
    for size in range(len(names), 0, -1):
        for group in combinations(range(len(names)), size):
            if ok(group):
                return [names[k] for k in sorted(group, key=lambda k: simulated[k])]
    return []


def judge(names: Sequence[str], measured: Sequence[float], noise: Sequence[float],
          simulated: Sequence[float], samples: Sequence[Sequence[float]] | None = None,
          per_round: int = 1) -> dict:
    """Spearman over all schedules and over the separated chain, and the pairs (none hidden)."""
    ps = pairs(names, measured, noise, simulated, samples, per_round)
    chain = separated_chain(names, simulated, noise)
    idx = [list(names).index(n) for n in chain]
    sep = [p for p in ps if p.separated]
    out = {"schedules": len(names), "spearman_all": spearman(measured, simulated),
           "same_order_all": [names[k] for k in np.argsort(measured)] == [names[k] for k in np.argsort(simulated)],
           "separated_chain": chain,
           "spearman_separated_chain": spearman([measured[k] for k in idx], [simulated[k] for k in idx]),
           "separated_pairs_same_order": sum(p.same_order for p in sep), "separated_pairs": len(sep),
           "noise_pairs_same_order": sum(p.same_order for p in ps if not p.separated),
           "noise_pairs": len(ps) - len(sep),
           "pairs": [asdict(p) for p in ps]}
    if samples is not None:
        psep = [p for p in ps if p.separated_paired]
        out.update(paired_separated_pairs=len(psep),
                   paired_separated_same_order=sum(p.same_order_paired for p in psep),
                   paired_noise_pairs_same_order=sum(p.same_order_paired for p in ps if not p.separated_paired),
                   paired_all_same_order=sum(p.same_order_paired for p in ps))
    return out
