"""The machine the runtime runs on, as the simulator sees it: one device kind for the local
processor and a link whose latency and bandwidth are measured by a gloo ping-pong on loopback."""
from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.errors import RuntimeExecutionError
from octopipe.runtime.launch import free_port, process_context

SIZES = (1, 1 << 18)         # float32 elements: a latency probe and a 1 MiB probe


def _pingpong(rank: int, port: int, repeats: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    times = {}
    for n in SIZES:
        buf = torch.zeros(n)
        samples = []
        for _ in range(repeats + 2):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            samples.append((time.perf_counter() - t0) / 2)
        times[n] = sorted(samples[2:])[len(samples[2:]) // 2]
    if rank == 0:
        Path(out).write_text(json.dumps({str(k): v for k, v in times.items()}))
    dist.barrier()
    dist.destroy_process_group()


def measure_loopback(repeats: int = 20, cache: Path | None = None) -> Link:
    """Latency and bandwidth of a gloo message between two local processes (median one-way)."""
    if cache is not None and cache.exists():
        d = json.loads(cache.read_text())
        return Link(d["name"], d["bandwidth"], d["latency"])
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"octopipe-pingpong-{os.getpid()}.json"
    ctx, port = process_context(), free_port()
    procs = [ctx.Process(target=_pingpong, args=(r, port, repeats, str(tmp))) for r in range(2)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
    finally:            # also on Ctrl-C: no ping-pong process outlives the launcher's wait
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                p.kill()
                p.join(timeout=5)
    if any(p.exitcode != 0 for p in procs) or not tmp.exists():
        raise RuntimeExecutionError("the loopback ping-pong between two gloo ranks failed; check that "
                                    "127.0.0.1 accepts local TCP connections")
    t = {int(k): v for k, v in json.loads(tmp.read_text()).items()}
    tmp.unlink()
    small, big = t[SIZES[0]], t[SIZES[1]]
    bandwidth = (SIZES[1] - SIZES[0]) * 4 / max(big - small, 1e-9)
    link = Link("gloo-loopback", bandwidth, small)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"name": link.name, "bandwidth": link.bandwidth, "latency": link.latency}))
    return link


def local_device_kind(device: str = "cpu") -> DeviceKind:
    """The local processor as a device kind; its nominal peak only feeds MFU-style ratios (the
    simulator's times come from measured costs)."""
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return DeviceKind(f"local-{props.name}", 1e15, float(props.total_memory), 3e12)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return DeviceKind("local-cpu", 1e11, float(memory), 2e10)


def local_cluster(n: int, link: Link, like: Cluster | None = None) -> Cluster:
    """`n` pipeline ranks on this machine, every pair joined by `link`; with `like`, the ranks
    keep that cluster's device kinds (emulating a heterogeneous cluster's compute). CPU ranks
    share the machine's memory: each gets an n-th of 80% of it (the rest for the processes
    themselves), so a plan that fits its devices fits the machine."""
    if like is not None:
        return Cluster(f"{like.name}@local", like.kinds, like.device_kind[:n], (0,) * n, link, link)
    kind = local_device_kind()
    if kind.name == "local-cpu":
        kind = replace(kind, memory_bytes=0.8 * kind.memory_bytes / max(1, n))
    return Cluster(f"local{n}", (kind,), (0,) * n, (0,) * n, link, link)
