"""The benchmarks' command lines answer under their module paths (python -m octopipe.measure.bench.*)."""
from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize("name", ["fidelity", "peer", "gpu", "memory_optimality"])
def test_every_benchmark_parses_its_command_line(name, capsys):
    module = importlib.import_module(f"octopipe.measure.bench.{name}")
    with pytest.raises(SystemExit) as info:
        module.main(["--help"])
    assert info.value.code == 0
    assert "--out" in capsys.readouterr().out
