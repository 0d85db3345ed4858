"""octopipe.io: atomic writes leave either the whole file or none."""
from __future__ import annotations

from pathlib import Path

import pytest

from octopipe.io import write_atomic


def test_a_writer_that_writes_nothing_leaves_no_file(tmp_path: Path):
    write_atomic(tmp_path / "figure.png", lambda p: None)
    assert list(tmp_path.iterdir()) == []


def test_a_failing_writer_leaves_neither_the_file_nor_its_temporary(tmp_path: Path):
    def half(p: Path) -> None:
        p.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomic(tmp_path / "summary.json", half)
    assert list(tmp_path.iterdir()) == []


def test_a_writer_replaces_the_file_whole(tmp_path: Path):
    (tmp_path / "a.txt").write_text("old")
    write_atomic(tmp_path / "a.txt", lambda p: p.write_text("new"))
    assert (tmp_path / "a.txt").read_text() == "new" and len(list(tmp_path.iterdir())) == 1
