"""Closed forms for the named schedules: bubble ratio and peak in-flight activations per device.

Each schedule's pair (`bubble_<name>`, `inflight_<name>`) is referenced by its registry entry
(`octopipe.schedule.library.SCHEDULES`), which also resolves chunk counts and checks arguments:
call `library.bubble_ratio` and `library.inflight_microbatches`.

This is the first of the three abstraction levels (formula → idealized table → simulation). The
formulas assume uniform stages; each docstring names the paper (and section) its form comes from.

Conventions shared by every function here:

- `p` devices, `m` micro-batches, `v` stages per device (chunks).
- Costs are per stage and per micro-batch: forward `f`, input gradient `i`, weight gradient `w`;
  a full backward costs `i + w`. The default is 1:1:1, the zero-bubble paper's assumption.
- The **bubble ratio** is idle time over total time of a device, `bubble / (bubble + compute)`.
  Papers often quote `bubble / compute` instead (Narayanan et al.'s `(p-1)/m`); we convert.
- **In-flight activations** are counted in units of *one stage's activations for one
  micro-batch*: a device holding 2 chunks of micro-batch 0 holds 2 units. An activation is
  live from its F until the action that frees it: B for a full backward, W for a split
  backward (the zero-bubble papers keep a micro-batch's memory until its W).
"""
from __future__ import annotations

Costs = tuple[float, float, float]
UNIT_COSTS: Costs = (1.0, 1.0, 1.0)


def _ratio(bubble: float, compute: float) -> float:
    return bubble / (bubble + compute) if bubble + compute > 0 else 0.0


def interleaved_group_size(n_devices: int, n_microbatches: int) -> int:
    """Micro-batches per round of the interleaved family (torch's `microbatches_per_round`).

    Rounds = max(1, m // p); when m is not a multiple of the rounds the first groups take the
    extra micro-batches, so the largest group is ceil(m / rounds).
    """
    rounds = max(1, n_microbatches // n_devices)
    return -(-n_microbatches // rounds)


# ----------------------------------------------------------------------------- bubble ratios

def bubble_gpipe(p: int, m: int, v: int, c: Costs) -> float:
    """GPipe, Huang et al. 2019 (arXiv 1811.06965) §2.2: bubble O((K-1)/(M+K-1)) of the step."""
    return (p - 1) / (m + p - 1)


def bubble_1f1b(p: int, m: int, v: int, c: Costs) -> float:
    """1F1B (PipeDream-Flush), Narayanan et al. 2021 (arXiv 2104.04473) §2.2.1:
    t_pb / t_id = (p-1)/m, i.e. (p-1)/(m+p-1) of the step. Same fill/drain as GPipe."""
    return (p - 1) / (m + p - 1)


def bubble_interleaved(p: int, m: int, v: int, c: Costs) -> float:
    """Interleaved 1F1B, Narayanan et al. 2021 §2.2.2: the bubble shrinks by the number of
    model chunks v, t_pb / t_id = (p-1)/(v·m), i.e. (p-1)/(v·m+p-1) of the step."""
    return (p - 1) / (v * m + p - 1)


def bubble_looped_bfs(p: int, m: int, v: int, c: Costs) -> float:
    """Looped BFS, Lamy-Poirier 2023 (arXiv 2211.05953) §3: with m ≥ p the loop never waits and
    the bubble is (p-1)/(v·m+p-1) as for interleaving. With m < p every loop after the first
    waits p-m slots for its first micro-batch to come round (our extension), adding (v-1)(p-m)."""
    wait = (v - 1) * max(0, p - m)
    return (p - 1 + wait) / (v * m + p - 1 + wait)


def bubble_zbh1(p: int, m: int, v: int, c: Costs) -> float:
    """ZB-H1, Qi et al. 2024 "Zero Bubble Pipeline Parallelism" (arXiv 2401.10241) §3.1:
    bubble (p-1)(T_F + T_B - T_W) against m(T_F + T_B + T_W) of work (T_B = input gradient).
    For v > 1 (torch's ZB1P over interleaved chunks) the per-device costs are v times a
    chunk's and the fill/drain is counted in chunk slots, as for interleaving."""
    f, i, w = c
    bubble = (p - 1) * (f + i - w)
    return _ratio(max(0.0, bubble), v * m * (f + i + w))


def bubble_zbh2(p: int, m: int, v: int, c: Costs) -> float:
    """ZB-H2, Qi et al. 2024 §3.1: bubble (p-1)(T_F + T_B - 2T_W), zero when T_F = T_B = T_W
    (with the optimizer step's post-validation, §4); 2p-1 micro-batches in flight."""
    f, i, w = c
    return _ratio(max(0.0, (p - 1) * (f + i - 2 * w)), m * (f + i + w))


def bubble_zbv(p: int, m: int, v: int, c: Costs) -> float:
    """ZB-V, Qi et al. 2024 §6: with two chunks in a V the bubble is (p-1)(T_F + T_B - 2T_W)
    with chunk-level costs, zero when T_F = T_B = T_W, at 1F1B's activation memory."""
    f, i, w = c
    return _ratio(max(0.0, (p - 1) * (f + i - 2 * w)), v * m * (f + i + w))


def bubble_dualpipev(p: int, m: int, v: int, c: Costs) -> float:
    """DualPipe(V), DeepSeek-AI 2024, DeepSeek-V3 report (arXiv 2412.19437) §3.2.1 Table 2 and
    the DualPipe README: bubble (PP/2-1)(F&B + B - 3W) with PP = 2p stages for DualPipeV. F&B
    is an overlapped forward+backward chunk pair; at the idealized level there is no overlap
    gain, so F&B = f + i + w, B = i + w, giving (p-1)(f + 2i - w)."""
    f, i, w = c
    return _ratio(max(0.0, (p - 1) * (f + 2 * i - w)), v * m * (f + i + w))


def bubble_chimera(p: int, m: int, v: int, c: Costs) -> float:
    """Chimera, Li & Hoefler SC'21 (arXiv 2107.06925) §3.2 / Table 2: (D-2)/(2N+D-2) with D
    stages and N micro-batches. Known to underestimate the idle time of the real table
    (Barley et al. 2026, arXiv 2605.24006: (8,16) gives 16% by formula, 26% in the table)."""
    return (p - 2) / (2 * m + p - 2)


def bubble_hanayo(p: int, m: int, v: int, c: Costs) -> float:
    """Hanayo, Liu et al. SC'23 (arXiv 2308.15762) §3: W waves give every device 2W chunks in a
    wave-like (V) placement; fill and drain are counted in chunk slots as for interleaving
    (Narayanan et al. 2021 §2.2.2), so the bubble is (p-1)/(v·m+p-1) with v = 2W."""
    return (p - 1) / (v * m + p - 1)


def bubble_pipedream(p: int, m: int, v: int, c: Costs) -> float:
    """PipeDream (asynchronous 1F1B), Narayanan et al. SOSP'19 §3.3: no flush, so in steady
    state every stage alternates F and B with no stall; the steady-state bubble is 0."""
    return 0.0


# ----------------------------------------------------------------------------- in-flight

def inflight_gpipe(p: int, d: int, m: int, v: int) -> float:
    """GPipe, Huang et al. 2019 §2.2: every stage keeps all m micro-batches until the flush."""
    return float(m)


def inflight_1f1b(p: int, d: int, m: int, v: int) -> float:
    """1F1B, Narayanan et al. 2021 §2.2.1 (and Megatron's theoretical_memory_usage): device d
    runs p-1-d warm-up forwards and one more before its first backward, so min(p-d, m)."""
    return float(min(p - d, m))


def inflight_interleaved(p: int, d: int, m: int, v: int) -> float:
    """Interleaved 1F1B, Narayanan et al. 2021 §2.2.2 with Megatron/torch's warm-up count
    (v-1)·G + 2(p-1-d) forwards (G micro-batches per round), plus one steady-state forward:
    min((v-1)·G + 2(p-1-d) + 1, v·m) chunk units. For d = 0, G = p this is p·(1 + (p-1)/(p·v))
    full-device micro-batches, Megatron's interleaving factor."""
    g = interleaved_group_size(p, m)
    return float(min((v - 1) * g + 2 * (p - 1 - d) + 1, v * m))


def inflight_looped_bfs(p: int, d: int, m: int, v: int) -> float:
    """Looped BFS, Lamy-Poirier 2023 §3: every forward of every local stage runs before any
    backward, so a device holds all v·m chunk activations at the turn."""
    return float(v * m)


def inflight_zbh1(p: int, d: int, m: int, v: int) -> float:
    """ZB-H1, Qi et al. 2024 §3.1: the same activation memory as 1F1B (p micro-batches) because
    the W passes of device d are deferred by d steady steps while its warm-up is d shorter.
    With torch's interleaved ZB1P (v chunks, warm-up (v-1)·G + p-1-d, W deferred by d):
    min((v-1)·G + p, v·m), the same on every device."""
    g = interleaved_group_size(p, m) if v > 1 else 0
    return float(min((v - 1) * g + p, v * m))


def inflight_zbh2(p: int, d: int, m: int, v: int) -> float:
    """ZB-H2, Qi et al. 2024 §3.1: peak activation memory (2p-1)·M_B. Device 0 needs it for its
    2p-1 warm-up forwards; later devices use the same allowance to run I passes ahead of their
    deferred W passes, so every device peaks at min(2p-1, m)."""
    return float(min(2 * p - 1, m))


def inflight_zbv(p: int, d: int, m: int, v: int) -> float:
    """ZB-V, Qi et al. 2024 §6: peak activation memory p·M_B, with M_B one micro-batch on a whole
    device (2 chunk units), i.e. 2p on every device. In the V warm-up device d runs 2p-1-d
    chunk-0 forwards and d+1 chunk-1 forwards before its first W frees anything; with fewer than
    2p-1 micro-batches (torch idles the surplus cells) each count is capped by m:
    min(m, 2p-1-d) + min(m, d+1)."""
    return float(min(m, 2 * p - 1 - d) + min(m, d + 1))


def inflight_dualpipev(p: int, d: int, m: int, v: int) -> float:
    """DualPipe(V), DeepSeek-V3 report §3.2.1 Table 2 / DualPipe README: activation memory PP+1
    chunks with PP = 2p stages, i.e. 2p+1 chunk units on every device (needs m ≥ 2p)."""
    return float(min(2 * p + 1, 2 * m))


def inflight_chimera(p: int, d: int, m: int, v: int) -> float:
    """Chimera, Li & Hoefler SC'21 §3.2 / Table 2: activation memory between (D/2+1) and D
    micro-batches per worker. Each direction runs 1F1B over at most p/2 micro-batches at a
    time: the down pipeline holds min(p-d, p/2) on device d, the up pipeline min(d+1, p/2);
    each direction is also capped by its m/2 micro-batches."""
    half = p // 2
    mh = m // 2
    return float(min(p - d, half, m - mh) + min(d + 1, half, mh))


def inflight_hanayo(p: int, d: int, m: int, v: int) -> float:
    """Hanayo, Liu et al. SC'23 §3: the same activation memory as 1F1B, p micro-batches of the
    whole device (p·v chunk units), which our generator enforces as a per-device cap. With few
    micro-batches the cap is not reached; counting the forwards our list scheduler runs before
    device d's first backward gives m + (v-2)·min(m, p) + d + 1, so the peak is
    min(m + (v-2)·min(m, p) + d + 1, p·v, v·m) (checked against the tables in the tests)."""
    return float(min(m + (v - 2) * min(m, p) + d + 1, p * v, v * m))


def inflight_pipedream(p: int, d: int, m: int, v: int) -> float:
    """PipeDream, Narayanan et al. SOSP'19 §3.3 (NOAM = ⌈workers / input-stage replicas⌉):
    stage d keeps p-d micro-batches (and weight versions) in flight in steady state."""
    return float(min(p - d, m))


__all__ = ["Costs", "UNIT_COSTS", "interleaved_group_size"] + [
    n for n in dir() if n.startswith(("bubble_", "inflight_"))]
