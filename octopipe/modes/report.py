"""The reporter: a mode's `Result` as the terminal summary and the run directory's files.

It prints `Result.report` in order, writes every artifact and then `summary.json` (with the
mode's name), each atomically (`octopipe.io`), so a run directory never holds half a file;
if one cannot be written, those written before it are removed: all the results or none."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from octopipe.io import write_atomic, write_json
from octopipe.modes.mode_result import Result


def console_for(width: int = 0) -> Console:
    """A console at least `width` columns wide when the output is not a terminal."""
    probe = Console()
    if probe.is_terminal:
        return probe
    return Console(width=max(probe.width, width or 120))


def publish(result: Result, mode: str, out_dir: Path, console: Console) -> dict[str, Any]:
    """Print the report, write the artifacts and summary.json; the summary as written."""
    for item in result.report:
        console.print(item)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    summary = {"mode": mode, **result.summary}
    try:
        for artifact in result.artifacts:
            write_atomic(out_dir / artifact.name, artifact.write)
            written.append(out_dir / artifact.name)
        write_json(out_dir / "summary.json", summary)
    except BaseException:
        for path in written:        # a failed run leaves no half set of results
            path.unlink(missing_ok=True)
        raise
    return summary
