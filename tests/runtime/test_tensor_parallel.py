"""Tensor-parallel layers against the whole layer, and the TP agreement under random readiness
(2 gloo processes, one launch)."""
from __future__ import annotations

import os
import random
import threading
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from octopipe.cluster import Link
from octopipe.config.runtime import RuntimeConfig
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.model.layer import LayerKind as K
from octopipe.model.layer import LayerSpec
from octopipe.plan import Plan, uniform_partition
from octopipe.runtime.job import Job
from octopipe.runtime.launch import execute, process_context
from octopipe.runtime.machine import local_cluster
from octopipe.runtime.tensor_parallel import NONE, Round, agree, check_grid, free_port, layer_errors
from octopipe.schedule.action import Action, ActionKind
from tests.runtime import tiny
from tests.runtime.random_tables import random_table

TP = 2


def models():
    extra = [LayerSpec(K.ATTENTION, tiny.H, heads=4, kv_heads=2, head_dim=8, qk_norm=True, bias=True),
             LayerSpec(K.MLP, tiny.H, ffn=48, activation="gelu", bias=True)]
    return [tiny.hybrid(), tiny.vlm(), tiny.model([tiny.emb(), *extra, tiny.head()], name="tiny_bias")]


def agreement_rounds(t: int, group, seed: int) -> tuple[list[int], int, float]:
    """Tasks 0..N-1 become ready at random times, differently on each rank; each round every
    rank picks its best ready task, they agree or defer; an agreed task runs one all-reduce (the
    TP collective), which must carry the same task on both ranks. Returns the order run, the
    rounds and the mean seconds per agreement."""
    rng = random.Random(seed * 10 + t)
    n = 12
    start = time.perf_counter()
    ready_at = {k: start + rng.uniform(0, 0.05) + 0.004 * k * rng.random() for k in range(n)}
    done: list[int] = []
    rounds, spent = 0, 0.0
    while len(done) < n:
        now = time.perf_counter()
        pick = min((k for k in range(n) if k not in done and ready_at[k] <= now), default=NONE)
        t0 = time.perf_counter()
        ok = agree(pick, group)
        spent += time.perf_counter() - t0
        rounds += 1
        if ok:
            v = torch.tensor([float(pick)])
            dist.all_reduce(v, group=group)
            assert int(v.item()) == TP * pick
            done.append(pick)
        if rounds > 100000:
            raise RuntimeError("agreement made no progress")
    return done, rounds, spent / rounds


def worker(t: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=t, world_size=TP)
    group = dist.new_group(list(range(TP)))
    errs = layer_errors(models(), t, TP, group)
    runs = [agreement_rounds(t, group, seed) for seed in range(5)]
    woken = threading.Event()
    rnd = Round(t, group, wake=woken.set)
    picks = rnd.result()
    torch.save({"errs": errs, "runs": runs, "round": (picks, woken.wait(10), rnd.done())},
               os.path.join(out, f"tp{t}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def tp_results(tmp_path_factory):
    """Both TP ranks from the runtime's forkserver (torch already imported there), not spawned."""
    out = str(tmp_path_factory.mktemp("tp"))
    process_context()       # the forkserver's preload: torch and the runtime
    mp.start_processes(worker, args=(free_port(), out), nprocs=TP, start_method="forkserver", join=True)
    return [torch.load(os.path.join(out, f"tp{t}.pt")) for t in range(TP)]


def test_every_layer_kind_split_two_ways_equals_the_whole_layer(tp_results):
    for r in tp_results:
        kinds = {k.split(":")[1] for k in r["errs"]}
        assert {"attention", "mlp", "moe", "head", "mamba2", "vit_block"} <= kinds
        worst = max(r["errs"].items(), key=lambda kv: kv[1])
        assert worst[1] <= 1e-5, worst


def test_agreement_under_random_readiness_runs_every_task_in_one_order(tp_results):
    a, b = tp_results
    for (order_a, rounds_a, cost_a), (order_b, rounds_b, _) in zip(a["runs"], b["runs"]):
        assert order_a == order_b and sorted(order_a) == list(range(12))
        assert rounds_a == rounds_b and cost_a > 0


def test_a_round_posted_without_blocking_gathers_every_pick_and_wakes_its_poster(tp_results):
    for r in tp_results:
        assert r["round"] == ([0, 1], True, True)


def test_bad_tp_names_the_field():
    model = tiny.hybrid()
    assert check_grid(model, 2, 2, 4).world == 4
    with pytest.raises(ConfigError, match=r"runtime\.tp=3 does not divide the hidden size"):
        check_grid(model, 3, 1)
    with pytest.raises(ConfigError, match="more than the 3 available"):
        check_grid(model, 2, 2, 3)
    with pytest.raises(ConfigError, match="kv_heads=1"):
        check_grid(tiny.model([tiny.emb(), LayerSpec(K.ATTENTION, 32, heads=4, kv_heads=1, head_dim=8),
                               tiny.head()]), 4, 1)
    with pytest.raises(ConfigError, match=r"runtime\.tp=0"):
        check_grid(model, 0, 1)


@pytest.mark.parametrize("dispatch", ["strict", "ready_first"])
def test_a_pp2_tp2_pipeline_agrees_on_the_tasks_with_collectives_and_never_hangs(dispatch):
    """4 processes (2 pipeline ranks x 2 TP ranks), emulated compute, random irregular tables
    under jitter and send delays: every run finishes; both TP ranks of each pipeline rank run
    the tasks with TP collectives (F, I, B: no model, so every stage has them) in the same order
    (the agreement under ready_first, the row under strict); under ready_first exactly those are
    agreed on, W never (RRFP's rule), each round is timed and recorded, and no W starts while a
    round is in flight."""
    for seed in range(2):
        table = random_table(n_devices=2, n_stages=4, n_microbatches=3, seed=seed, split_prob=0.5)
        costs = CostTable.uniform(4, f=1.0, i=1.0, w=1.0, out_bytes=1e3, kinds=("local-cpu",))
        config = RuntimeConfig(compute="emulated", dispatch=dispatch, hint="bfw"
                               if dispatch == "ready_first" else "table",
                               tp=2, iterations=1, warmup=0, emulate_step_s=0.004, jitter_cv=0.5,
                               transfer_delay=0.5, timeout_s=120.0, stall_s=30.0,
                               max_inflight=None if dispatch == "ready_first" else "plan")
        res = execute(Job(Plan(uniform_partition(4, 4), table), None, config, seed=seed, costs=costs,
                          cluster=local_cluster(2, Link("loopback", 5e8, 1e-4))))
        orders = [[e["action"] for e in sorted((e for e in ev if "action" in e), key=lambda e: e["start"])]
                  for ev in res.events]
        agreed = [[a for a in o if Action.parse(a).kind is not ActionKind.W] for o in orders]
        assert len(orders) == 4 and agreed[0] == agreed[1] and agreed[2] == agreed[3]
        assert sorted(orders[0]) == sorted(orders[1]) and sorted(orders[2]) == sorted(orders[3])
        rounds = [e for ev in res.events for e in ev if "agree_rounds" in e]
        if dispatch == "ready_first":
            assert all(e["agree_rounds"] >= e["agree_tasks"] > 0 and e["agree_us"] > 0 for e in rounds)
            assert [e["agree_tasks"] for e in rounds] == [len(a) for a in agreed]
            for ev in res.events:   # each round is recorded; no W (it ranks below the pick) runs during one
                held = [(e["post"], e["end"]) for e in ev if "round" in e]
                assert len(held) == sum(e["agree_rounds"] for e in ev if "agree_rounds" in e)
                assert sum(e["agreed"] for e in ev if "round" in e) == sum(e["agree_tasks"] for e in ev
                                                                           if "agree_tasks" in e)
                ws = [e["start"] for e in ev if "action" in e and Action.parse(e["action"]).kind is ActionKind.W]
                assert not any(p < w < q for w in ws for p, q in held)
        else:   # strict: the row fixes the order on every TP rank, nothing to agree on
            assert all(e["agree_rounds"] == 0 for e in rounds)
