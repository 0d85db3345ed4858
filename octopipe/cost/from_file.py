"""Cost tables from measured per-layer profiles (`cost=file`).

A profile lists, for every layer in model order, the measured forward time and either the full
backward time or its input- and weight-gradient parts, in milliseconds per micro-batch; it may
also give per-layer memory and message bytes and a label per layer. Two file formats hold it.

CSV (`.csv`): optional `# key: value` header lines for the metadata (name, source, seq_len,
micro_batch_size, hidden, label_kinds as `M=mamba2;-=mlp`), then one header row and one row per
layer::

    # name: my-model
    # hidden: 4096
    label,f_ms,b_ms,act_bytes,static_bytes,out_bytes
    M+E,3.35,8.76,1.2e9,2.0e9,3.3e7
    -,1.92,3.48,0.8e9,1.0e9,3.3e7

Columns: `f_ms` (required); `b_ms`, or `i_ms` and `w_ms` (one of the two is required; with all
three, b must equal i + w); `label`; `act_bytes` (activation bytes a layer keeps from F to its
backward), `w_act_bytes` (the part of `act_bytes` the weight-gradient pass W still needs after the
input-gradient pass I: zero-bubble's memory model has F allocate `act_bytes`, I free all but
`w_act_bytes`, W free those; at most `act_bytes`, and only with it; absent: 0, so I frees all),
`static_bytes` (parameter + gradient + optimizer bytes), `out_bytes` (bytes the layer sends to
the next one); a `layer` column, if present, must count 0, 1, 2, ...

JSON (`.json`): an object with the same metadata keys and either `"layers": [{"label": ...,
"f_ms": ..., "b_ms": ...}, ...]` (a record per layer) or column arrays `"f_ms": [...]`,
`"b_ms": [...]`, `"labels": [...]` (`"arch"` is accepted for labels, as the OctoPipe authors'
profile file names it).

Labels name a layer's type. A composite label such as `M+E` (a Mamba layer with the embedding
folded in) or `-+H` (an MLP with the LM head folded in) says the measured time is the sum of its
parts. `averaging=type` applies the OctoPipe authors' tool's rule (PipelineSimulator): every layer's time becomes
the mean of its type's measured times; a part that never appears alone is inferred from the
composites by subtraction (`E = t(M+E) - mean(M)`), and a composite's time is the sum of its
parts' means. A composite whose parts cannot all be inferred keeps its measured time.
`averaging=raw` keeps every layer's measured time.

When only the full backward is known, the schedule's split backward uses I = split·B and
W = (1 - split)·B; `split=0.5` is the authors' convention (I = W = B/2). `tick_ms` rounds every
F and full B up to a multiple of the tick (the authors' simulator counts in 0.1 ms ticks); the
split is taken from the rounded B, so F + B totals stay those of the rounded profile.

The profile defines the layers: `model_from_profile` builds the ModelSpec it describes, so that
`cost=file` needs no model preset with the same layer count.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from octopipe.config.convert import check, convert
from octopipe.config.cost import FileCost
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.io import read_text
from octopipe.model.layer import LayerKind, LayerSpec
from octopipe.model.spec import ModelSpec

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


# ---------------------------------------------------------------------------------------------
# Reading and checking


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


# ---------------------------------------------------------------------------------------------
# Presets


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


# ---------------------------------------------------------------------------------------------
# Averaging, rounding, splitting


def label_parts(label: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in label.split("+"))


def type_means(times: np.ndarray, labels: Sequence[str]) -> dict[str, float]:
    """Mean time per label part: pure layers first, then parts inferred from composites.

    A composite with exactly one part of unknown mean yields a sample of that part (its time
    minus the known parts' means); inference repeats until no new part can be found.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for t, lab in zip(times, labels):
        parts = label_parts(lab)
        if len(parts) == 1:
            sums[parts[0]] = sums.get(parts[0], 0.0) + float(t)
            counts[parts[0]] = counts.get(parts[0], 0) + 1
    means = {p: sums[p] / counts[p] for p in sums}
    while True:
        sums, counts = {}, {}
        for t, lab in zip(times, labels):
            unknown = [p for p in label_parts(lab) if p not in means]
            if len(unknown) == 1:
                known = sum(means[p] for p in label_parts(lab) if p in means)
                sums[unknown[0]] = sums.get(unknown[0], 0.0) + float(t) - known
                counts[unknown[0]] = counts.get(unknown[0], 0) + 1
        if not sums:
            return means
        means.update({p: sums[p] / counts[p] for p in sums})


def type_average(times: np.ndarray, labels: Sequence[str], what: str = "time") -> np.ndarray:
    """Each layer's time as the sum of its label parts' means (measured time where unknown)."""
    means = type_means(times, labels)
    out = np.array([sum(means[p] for p in label_parts(lab))
                    if all(p in means for p in label_parts(lab)) else float(t)
                    for t, lab in zip(times, labels)])
    bad = np.flatnonzero(out < 0)
    if bad.size:
        j = int(bad[0])
        raise ConfigError(f"type-averaged {what} of layer {j} ({labels[j]!r}) is {out[j]:g} ms < 0: "
                          f"its inferred parts exceed its measurement; use cost.averaging=raw")
    return out


def ceil_to_tick(times: np.ndarray, tick_ms: float | None) -> np.ndarray:
    """Round up to a multiple of `tick_ms` (None or 0: unchanged), robust to float noise."""
    if not tick_ms:
        return times
    return np.ceil(np.round(times / tick_ms, 9)) * tick_ms


@dataclass(frozen=True)
class ProfileOptions:
    """How a profile becomes costs: averaging (`raw`|`type`), backward split, tick rounding.

    `round_split` rounds I and W each up to the tick (instead of the full B), as the authors'
    tool does for its split-backward (ZB-H) baseline; B = I + W may then exceed the rounded B.
    """

    averaging: str = FileCost.averaging     # defaults and ranges: octopipe.config.cost.FileCost
    split: float = FileCost.split
    tick_ms: float | None = FileCost.tick_ms
    round_split: bool = FileCost.round_split

    def __post_init__(self) -> None:
        check(FileCost(averaging=self.averaging, split=self.split, tick_ms=self.tick_ms,
                       round_split=self.round_split), "cost.")

    @classmethod
    def of(cls, cost: FileCost) -> "ProfileOptions":
        """The options of a typed `cost=file` section."""
        return cls(cost.averaging, cost.split, cost.tick_ms, cost.round_split)


def profile_times(profile: Profile, opts: ProfileOptions) -> dict[str, np.ndarray]:
    """Per-layer F, I, W (ms) after averaging, rounding and splitting, plus the full B."""
    if opts.averaging == "type" and profile.labels is None:
        raise ConfigError(f"cost.averaging=type needs layer labels, but profile {profile.name!r} "
                          f"is unlabelled; add a label column or set cost.averaging=raw")

    def prep(times: np.ndarray, what: str) -> np.ndarray:
        if opts.averaging == "type":
            times = type_average(times, profile.labels, what)
        return ceil_to_tick(times, opts.tick_ms)

    f = prep(profile.f_ms, "f_ms")
    if profile.b_ms is not None and opts.round_split:
        i = prep(profile.b_ms * opts.split, "b_ms")
        w = prep(profile.b_ms * (1.0 - opts.split), "b_ms")
        b = i + w
    elif profile.b_ms is not None:
        b = prep(profile.b_ms, "b_ms")
        i = b * opts.split
        w = b - i
    else:
        i = prep(profile.i_ms, "i_ms")
        w = prep(profile.w_ms, "w_ms")
        b = i + w
    return {"f": f, "i": i, "w": w, "b": b}


def describe(profile: Profile, opts: ProfileOptions) -> str:
    """One sentence saying how the profile's numbers become costs (averaging, split, rounding)."""
    avg = ("type-averaged (mean per layer type, composite parts inferred by subtraction)"
           if opts.averaging == "type" else "raw per-layer times")
    if profile.b_ms is None:
        split = "measured I and W"
    else:
        split = (f"full B measured, split assumed I = {opts.split:g}·B, W = {1 - opts.split:g}·B "
                 f"(cost.split)")
    tick = f"; rounded up to {opts.tick_ms:g} ms" if opts.tick_ms else ""
    if opts.tick_ms and opts.round_split and profile.b_ms is not None:
        tick += " (I and W rounded separately)"
    return f"{profile.name}: {profile.n_layers} layers, {avg}; {split}{tick}"


# ---------------------------------------------------------------------------------------------
# ModelSpec and CostTable


def layer_kind(label: str, label_kinds: Mapping[str, str]) -> LayerKind:
    """The kind of a labelled layer: its first part that is not the embedding or head, if any."""
    kinds = {**DEFAULT_LABEL_KINDS, **label_kinds}
    parts = label_parts(label)
    main = [p for p in parts if kinds.get(p) not in ("embedding", "head")] or list(parts)
    value = kinds.get(main[0])
    if value is None:
        raise ConfigError(f"layer label part {main[0]!r} has no layer kind; add it to the "
                          f"profile's label_kinds (e.g. {main[0]}=mlp)")
    return LayerKind(value)


def model_from_profile(profile: Profile) -> ModelSpec:
    """The ModelSpec a profile describes: one LayerSpec per profiled layer, named by its label.

    Shape fields other than `hidden` stay 0: the costs come from the measurements, not from
    shapes. Unlabelled layers are MLPs named `layerJ`.
    """
    labels = profile.labels or tuple(f"layer{j}" for j in range(profile.n_layers))
    layers = tuple(
        LayerSpec(kind=layer_kind(lab, profile.label_kinds) if profile.labels else LayerKind.MLP,
                  hidden=profile.hidden, name=lab)
        for lab in labels)
    return ModelSpec(name=profile.name, layers=layers, seq_len=profile.seq_len,
                     micro_batch_size=profile.micro_batch_size, source=profile.source)


def _message_bytes(profile: Profile, model: ModelSpec | None) -> np.ndarray:
    """Bytes a layer's output carries to the next one: measured, else the bf16 hidden state."""
    n = profile.n_layers
    if profile.out_bytes is not None:
        return profile.out_bytes
    if profile.hidden and profile.seq_len:
        return np.full(n, 2.0 * profile.hidden * profile.seq_len * profile.micro_batch_size)
    if model is not None and model.n_layers == n and model.seq_len:
        return np.array([2.0 * lay.hidden * model.tokens_per_microbatch for lay in model.layers])
    return np.zeros(n)


def profile_cost_table(profile: Profile, opts: ProfileOptions, kinds: Sequence[str] = ("dev",),
                       model: ModelSpec | None = None) -> CostTable:
    """The CostTable of a profile; every device kind gets the measured times (one GPU type)."""
    t = profile_times(profile, opts)
    k = len(kinds)
    n = profile.n_layers

    def cols(a: np.ndarray) -> np.ndarray:
        return np.repeat((a / 1e3)[:, None], k, axis=1)

    zeros = np.zeros(n)
    names = profile.labels or tuple(f"layer{j}" for j in range(n))
    tokens = profile.seq_len * profile.micro_batch_size
    if model is not None and model.n_layers == n:
        tokens = tokens or model.tokens_per_microbatch
    return CostTable(
        layer_names=tuple(names), kinds=tuple(kinds),
        f=cols(t["f"]), i=cols(t["i"]), w=cols(t["w"]),
        act_bytes=profile.act_bytes if profile.act_bytes is not None else zeros,
        static_bytes=profile.static_bytes if profile.static_bytes is not None else zeros,
        out_bytes=_message_bytes(profile, model), params=zeros,
        w_act_bytes=profile.w_act_bytes if profile.w_act_bytes is not None else zeros,
        tokens_per_microbatch=int(tokens))


def file_cost(cost: FileCost | Mapping[str, Any]) -> FileCost:
    """`cost` as a typed section (a raw mapping, e.g. from a test, goes through the schema)."""
    return cost if isinstance(cost, FileCost) else convert(FileCost, cost, "cost.")


def profile_of(cost: FileCost) -> Profile:
    """The profile named by `cost.path` or `cost.preset` (exactly one)."""
    cost = file_cost(cost)
    path, preset = cost.path, cost.preset
    if path and preset:
        raise ConfigError(f"cost.path={path!r} and cost.preset={preset!r} both given; choose one")
    if path:
        return read_profile(path)
    if preset:
        return load_preset(str(preset))
    raise ConfigError(f"cost=file needs cost.path=PATH (a .csv or .json profile) or "
                      f"cost.preset=NAME; presets: {', '.join(profile_presets())}")


def model_for_file_cost(cost: FileCost, model: ModelSpec | None) -> ModelSpec:
    """The ModelSpec to plan with under `cost=file`: `model` when its layer count matches the
    profile's, otherwise the profile's own layers (`model_from_profile`)."""
    profile = profile_of(cost)
    if model is not None and model.n_layers == profile.n_layers:
        return model
    return model_from_profile(profile)


def load_cost_file(cost: FileCost, model: ModelSpec | None, cluster: Any) -> CostTable:
    """`cost=file`: the CostTable of the configured profile on the cluster's device kinds.

    The profile defines the layers: when its layer count differs from `model`'s, the table
    follows the profile and `model_from_profile(profile_of(cost))` is the matching ModelSpec.
    """
    cost = file_cost(cost)
    kinds = tuple(k.name for k in cluster.kinds) if cluster is not None else ("dev",)
    return profile_cost_table(profile_of(cost), ProfileOptions.of(cost), kinds, model)
