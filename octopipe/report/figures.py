"""Figure set-up and saving, for every picture OctoPipe draws: matplotlib on the Agg backend
(files only, no display), imported on first use, each figure closed once saved."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (an existing choice of backend is kept)."""
    import matplotlib  # heavy: only where a picture is drawn

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt  # heavy: only where a picture is drawn

    return plt


def save(fig: Any, path: str | Path, dpi: int = 110, tight: bool = True) -> Path:
    """Lay `fig` out (`tight`), write it to `path` at `dpi` and close it; the path written."""
    path = Path(path)
    try:
        if tight:
            fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        pyplot().close(fig)
    return path
