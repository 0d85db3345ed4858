"""The per-layer profile file format (CSV or JSON; see `octopipe.cost.from_file`): its fields,
parsing with one error per bad cell, writing, and the bundled presets."""
from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from octopipe.errors import ConfigError
from octopipe.io import read_text
from octopipe.model.layer import LayerKind

PRESET_DIR = Path(__file__).resolve().parent / "profiles"


TIME_FIELDS = ("f_ms", "b_ms", "i_ms", "w_ms")


BYTE_FIELDS = ("act_bytes", "w_act_bytes", "static_bytes", "out_bytes")


META_FIELDS = ("name", "source", "device", "seq_len", "micro_batch_size", "hidden", "label_kinds")


DEFAULT_LABEL_KINDS = {"E": "embedding", "H": "head", "M": "mamba2", "-": "mlp", "*": "attention"}


@dataclass(frozen=True, eq=False)
class Profile:
    """Measured per-layer times (ms per micro-batch) and optional bytes, as read from a file.

    Exactly one of `b_ms` or (`i_ms`, `w_ms`) is set; `labels` is None for an unlabelled file.
    `label_kinds` maps a label part (`M`, `-`, `E`) to a LayerKind value for `model_from_profile`.
    """

    name: str
    f_ms: np.ndarray
    b_ms: np.ndarray | None = None
    i_ms: np.ndarray | None = None
    w_ms: np.ndarray | None = None
    labels: tuple[str, ...] | None = None
    act_bytes: np.ndarray | None = None
    static_bytes: np.ndarray | None = None
    out_bytes: np.ndarray | None = None
    w_act_bytes: np.ndarray | None = None
    seq_len: int = 0
    micro_batch_size: int = 1
    hidden: int = 0
    source: str = ""
    device: str = ""
    label_kinds: Mapping[str, str] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return len(self.f_ms)

    @property
    def full_b_ms(self) -> np.ndarray:
        """The full backward per layer, measured or as I + W."""
        return self.b_ms if self.b_ms is not None else self.i_ms + self.w_ms


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or value is None or (isinstance(value, str) and not value.strip()):
        raise ConfigError(f"{where}: missing value; give a number")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {value!r} is not a number") from None
    if not math.isfinite(x):
        raise ConfigError(f"{where}: {value!r} is not finite; give a measured number")
    if x < 0:
        raise ConfigError(f"{where}: {x:g} is negative; times and bytes must be >= 0")
    return x


def _int_meta(meta: Mapping[str, Any], key: str, default: int, origin: str) -> int:
    val = meta.get(key)
    if val in (None, ""):
        return default
    x = _number(val, f"{origin}: {key}")
    if x != int(x):
        raise ConfigError(f"{origin}: {key}={val!r} must be a whole number")
    return int(x)


def _label_kinds(raw: Any, origin: str) -> dict[str, str]:
    if raw in (None, ""):
        return {}
    if isinstance(raw, str):
        pairs = [p for p in raw.replace(",", ";").split(";") if p.strip()]
        out = {}
        for p in pairs:
            if "=" not in p:
                raise ConfigError(f"{origin}: label_kinds entry {p!r} must read LABEL=kind")
            k, _, v = p.partition("=")
            out[k.strip()] = v.strip()
        raw = out
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{origin}: label_kinds must map labels to layer kinds")
    valid = {k.value for k in LayerKind}
    for k, v in raw.items():
        if v not in valid:
            raise ConfigError(f"{origin}: label_kinds[{k!r}] = {v!r} is not a layer kind; "
                              f"valid: {', '.join(sorted(valid))}")
    return {str(k): str(v) for k, v in raw.items()}


def profile_from_columns(columns: Mapping[str, Sequence[Any]], meta: Mapping[str, Any],
                         origin: str) -> Profile:
    """Check column arrays (one entry per layer) and build a Profile; `origin` names the input."""
    if "f_ms" not in columns:
        raise ConfigError(f"{origin}: no f_ms column; give per-layer forward times in ms")
    n = len(columns["f_ms"])
    if n == 0:
        raise ConfigError(f"{origin}: the profile lists no layers")
    for key, col in columns.items():
        if len(col) != n:
            raise ConfigError(f"{origin}: column {key} has {len(col)} entries but f_ms has {n}; "
                              f"every column needs one entry per layer")
    has_b = "b_ms" in columns
    has_iw = "i_ms" in columns and "w_ms" in columns
    if ("i_ms" in columns) != ("w_ms" in columns):
        raise ConfigError(f"{origin}: give both i_ms and w_ms, or b_ms alone")
    if not (has_b or has_iw):
        raise ConfigError(f"{origin}: no backward times; give b_ms (full backward) or i_ms and w_ms")

    arrays: dict[str, np.ndarray] = {}
    for key in TIME_FIELDS + BYTE_FIELDS:
        if key in columns:
            arrays[key] = np.array([_number(v, f"{origin}: layer {j} field {key}")
                                    for j, v in enumerate(columns[key])], dtype=np.float64)
    if has_b and has_iw:
        gap = np.abs(arrays["b_ms"] - arrays["i_ms"] - arrays["w_ms"])
        bad = np.flatnonzero(gap > 1e-6 + 1e-3 * arrays["b_ms"])
        if bad.size:
            j = int(bad[0])
            raise ConfigError(f"{origin}: layer {j}: b_ms={arrays['b_ms'][j]:g} differs from "
                              f"i_ms + w_ms = {arrays['i_ms'][j] + arrays['w_ms'][j]:g}; "
                              f"give b_ms or i_ms/w_ms, not both")
        del arrays["b_ms"]
    if "w_act_bytes" in arrays:
        if "act_bytes" not in arrays:
            raise ConfigError(f"{origin}: w_act_bytes needs an act_bytes column (the part of a "
                              "layer's activations W still needs is a part of them)")
        over = np.flatnonzero(arrays["w_act_bytes"] > arrays["act_bytes"] * (1 + 1e-9))
        if over.size:
            j = int(over[0])
            raise ConfigError(f"{origin}: layer {j}: w_act_bytes={arrays['w_act_bytes'][j]:g} "
                              f"exceeds act_bytes={arrays['act_bytes'][j]:g}; W keeps a part of "
                              "the activations F stored")

    labels = None
    if "labels" in columns:
        labels = tuple("" if v is None else str(v).strip() for v in columns["labels"])
        missing = [j for j, lab in enumerate(labels) if not lab]
        if missing:
            raise ConfigError(f"{origin}: layer {missing[0]} has no label; label every layer "
                              f"or none")
        for j, lab in enumerate(labels):
            if any(not p.strip() for p in lab.split("+")):
                raise ConfigError(f"{origin}: layer {j} label {lab!r} has an empty part; "
                                  f"write composites as PART+PART (e.g. M+E)")
    return Profile(
        name=str(meta.get("name") or Path(origin).stem),
        labels=labels,
        seq_len=_int_meta(meta, "seq_len", 0, origin),
        micro_batch_size=_int_meta(meta, "micro_batch_size", 1, origin),
        hidden=_int_meta(meta, "hidden", 0, origin),
        source=str(meta.get("source") or ""),
        device=str(meta.get("device") or ""),
        label_kinds=_label_kinds(meta.get("label_kinds"), origin),
        **{k: arrays.get(k) for k in ("f_ms", "b_ms", "i_ms", "w_ms") + BYTE_FIELDS},
    )


def parse_csv(text: str, origin: str = "<csv>") -> Profile:
    """A profile from CSV text (see the module docstring for the columns)."""
    meta: dict[str, str] = {}
    body = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            key, sep, value = stripped.lstrip("#").partition(":")
            if sep and key.strip() in META_FIELDS:
                meta[key.strip()] = value.strip()
            continue
        if stripped:
            body.append(line)
    rows = list(csv.reader(io.StringIO("\n".join(body))))
    if not rows:
        raise ConfigError(f"{origin}: no header row; the first row must name the columns "
                          f"(label,f_ms,b_ms,...)")
    header = [h.strip() for h in rows[0]]
    twice = next((h for k, h in enumerate(header) if h in header[:k]), None)
    if twice is not None:
        raise ConfigError(f"{origin}: the header names column {twice} twice (columns {header.index(twice)} and "
                          f"{header.index(twice, header.index(twice) + 1)}); keep one")
    known = {"layer", "label", *TIME_FIELDS, *BYTE_FIELDS}
    unknown = [h for h in header if h not in known]
    if unknown:
        raise ConfigError(f"{origin}: unknown column {unknown[0]!r}; valid: {', '.join(sorted(known))}")
    columns: dict[str, list[str]] = {h: [] for h in header}
    for r, row in enumerate(rows[1:]):
        if len(row) != len(header):
            raise ConfigError(f"{origin}: data row {r} (layer {r}) has {len(row)} cells but the "
                              f"header has {len(header)}; every row needs one cell per column")
        for h, cell in zip(header, row):
            columns[h].append(cell.strip())
    if "layer" in columns:
        for r, cell in enumerate(columns.pop("layer")):
            if cell != str(r):
                raise ConfigError(f"{origin}: data row {r} has layer {cell!r}; list layers in "
                                  f"order 0, 1, 2, ...")
    if "label" in columns:
        columns["labels"] = columns.pop("label")
    return profile_from_columns(columns, meta, origin)


def parse_json(doc: Any, origin: str = "<json>") -> Profile:
    """A profile from a JSON document: records under `layers`, or column arrays."""
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{origin}: expected a JSON object with `layers` or column arrays")
    meta = {k: doc.get(k) for k in META_FIELDS}
    if "layers" in doc and isinstance(doc["layers"], list):
        records = doc["layers"]
        keys: list[str] = []
        for r, rec in enumerate(records):
            if not isinstance(rec, Mapping):
                raise ConfigError(f"{origin}: layers[{r}] is not an object")
            for k in rec:
                if k not in keys:
                    keys.append(k)
        known = {"label", *TIME_FIELDS, *BYTE_FIELDS}
        unknown = [k for k in keys if k not in known]
        if unknown:
            raise ConfigError(f"{origin}: unknown layer field {unknown[0]!r}; valid: "
                              f"{', '.join(sorted(known))}")
        for r, rec in enumerate(records):
            lacking = [k for k in keys if k not in rec]
            if lacking:
                raise ConfigError(f"{origin}: layers[{r}] lacks field {lacking[0]!r} that other "
                                  f"layers give; every layer needs the same fields")
        columns = {("labels" if k == "label" else k): [rec[k] for rec in records] for k in keys}
    else:
        columns = {k: doc[k] for k in (*TIME_FIELDS, *BYTE_FIELDS) if k in doc}
        lab = doc.get("labels", doc.get("arch"))
        if lab is not None:
            columns["labels"] = lab
        for k, v in columns.items():
            if not isinstance(v, list):
                raise ConfigError(f"{origin}: {k} must be a list with one entry per layer")
    return profile_from_columns(columns, meta, origin)


def read_profile(path: str | Path) -> Profile:
    """Read a `.csv` or `.json` profile file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"cost.path={str(path)!r}: no such file; give a profile .csv or .json")
    text = read_text(p, "cost.path")
    if p.suffix.lower() == ".csv":
        return parse_csv(text, str(p))
    if p.suffix.lower() == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return parse_json(doc, str(p))
    raise ConfigError(f"cost.path={str(path)!r}: unknown format {p.suffix!r}; use .csv or .json")


def _columns_of(profile: Profile) -> dict[str, np.ndarray | tuple[str, ...]]:
    cols: dict[str, Any] = {}
    if profile.labels is not None:
        cols["label"] = profile.labels
    for k in ("f_ms", "b_ms", "i_ms", "w_ms") + BYTE_FIELDS:
        v = getattr(profile, k)
        if v is not None:
            cols[k] = v
    return cols


def _meta_of(profile: Profile) -> dict[str, Any]:
    return {"name": profile.name, "source": profile.source, "device": profile.device,
            "seq_len": profile.seq_len, "micro_batch_size": profile.micro_batch_size,
            "hidden": profile.hidden, "label_kinds": dict(profile.label_kinds)}


def write_profile(profile: Profile, path: str | Path) -> None:
    """Write a profile as CSV or JSON (by suffix), in the formats `read_profile` reads."""
    p = Path(path)
    cols = _columns_of(profile)
    if p.suffix.lower() == ".json":
        doc = {"format": "octopipe-profile", "version": 1, **_meta_of(profile)}
        doc["layers"] = [{k: (v[j] if k == "label" else float(v[j])) for k, v in cols.items()}
                         for j in range(profile.n_layers)]
        p.write_text(json.dumps(doc, indent=1) + "\n")
        return
    if p.suffix.lower() != ".csv":
        raise ConfigError(f"{p}: unknown format {p.suffix!r}; use .csv or .json")
    buf = io.StringIO()
    for k, v in _meta_of(profile).items():
        if k == "label_kinds":
            v = ";".join(f"{a}={b}" for a, b in v.items())
        if v not in ("", None):
            buf.write(f"# {k}: {v}\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(list(cols))
    for j in range(profile.n_layers):
        w.writerow([v[j] if k == "label" else repr(float(v[j])) for k, v in cols.items()])
    p.write_text(buf.getvalue())


def profile_presets() -> tuple[str, ...]:
    """The names of the OctoPipe authors' per-layer profiles shipped in `octopipe/cost/profiles/`."""
    return tuple(sorted(p.stem for p in PRESET_DIR.glob("*.json")))


def load_preset(name: str) -> Profile:
    """One of the OctoPipe authors' per-layer profiles shipped in `octopipe/cost/profiles/<name>.json`."""
    path = PRESET_DIR / f"{name}.json"
    if not path.is_file():
        raise ConfigError(f"cost.preset={name!r} is not a profile preset; valid: "
                          f"{', '.join(profile_presets())}")
    return read_profile(path)
