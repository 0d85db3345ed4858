"""Turn a raw mapping (a Hydra DictConfig section, a dict) into a typed config dataclass, once.

Each field is converted by its annotation and checked against its `Bounds`; the first violation
raises `ConfigError` with one line naming the field (with its group prefix), the value and the
valid range. Non-numbers, NaN, infinities (unless the bounds allow them), booleans where a number
is expected and unknown keys are all rejected: there is no silent fallback.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union

from omegaconf import DictConfig, ListConfig, OmegaConf

from octopipe.config.fields import Bounds, bounds_of
from octopipe.errors import ConfigError

T = TypeVar("T")


def to_plain(raw: Any) -> Any:
    """A DictConfig/ListConfig (or anything mapping-like) as plain dicts and lists."""
    if isinstance(raw, (DictConfig, ListConfig)):
        return OmegaConf.to_container(raw, resolve=True)
    return raw


def convert(cls: type[T], raw: Any, prefix: str = "") -> T:
    """`cls` built from `raw` (missing keys take the declared defaults). `prefix` ("runtime.")
    names the group in error messages."""
    raw = to_plain(raw)
    if raw is None:
        raw = {}
    if dataclasses.is_dataclass(raw) and isinstance(raw, cls):
        return raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}={raw!r}: expected a mapping of "
                          f"{', '.join(f.name for f in dataclasses.fields(cls))}")
    # a preset file read directly (OmegaConf.load) still carries its Hydra defaults list
    raw = {k: v for k, v in raw.items() if k != "defaults"}
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in raw if k not in names)
    if unknown:
        raise ConfigError(f"{prefix}{unknown[0]}: unknown key; valid keys: {', '.join(sorted(names))}")
    values = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{prefix}{f.name}: missing; give {_describe(hints[f.name], bounds_of(f))}")
            continue
        values[f.name] = value_of(hints[f.name], raw[f.name], f"{prefix}{f.name}", bounds_of(f))
    return cls(**values)


def check(obj: Any, prefix: str = "") -> None:
    """Raise ConfigError (one line) unless every field of the dataclass `obj` has its declared
    type and lies in its range: for values built in code rather than read from a config."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value_of(hints[f.name], getattr(obj, f.name), f"{prefix}{f.name}", bounds_of(f))


def value_of(tp: Any, value: Any, name: str, bounds: Bounds = Bounds()) -> Any:
    """`value` converted to annotation `tp`, or ConfigError naming `name`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if value is None:
            if len(options) < len(args):
                return None
            raise ConfigError(f"{name}=null: a value is required ({_describe(tp, bounds)})")
        for opt in options:
            try:
                return value_of(opt, value, name, bounds)
            except ConfigError:
                continue
        raise ConfigError(f"{name}={value!r}: must be {_describe(tp, bounds)}")
    if origin is Literal:
        for choice in args:
            if value == choice and type(value) is type(choice):
                return choice
        if isinstance(value, bool) and str(value).lower() in args:
            return str(value).lower()
        raise ConfigError(f"{name}={value!r}: choose one of {', '.join(map(_show, args))}")
    if dataclasses.is_dataclass(tp):
        return convert(tp, value, f"{name}.")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}={value!r}: must be true or false")
    if tp is int:
        return _integer(value, name, bounds)
    if tp is float:
        return _number(value, name, bounds)
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{name}={value!r}: must be a string")
    if origin in (tuple, list):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}={value!r}: must be a list, e.g. {name}=[...]")
        if origin is tuple and len(args) == 2 and args[1] is not Ellipsis:
            raise TypeError(f"config field {name}: use tuple[X, ...], not {tp!r}")
        if len(value) < bounds.min_items:
            raise ConfigError(f"{name}={list(value)!r}: give at least {bounds.min_items} item"
                              f"{'s' if bounds.min_items > 1 else ''}")
        item = args[0] if args else Any
        out = [value_of(item, v, f"{name}[{i}]", bounds) for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{name}={value!r}: must be a mapping")
        return dict(value)
    raise TypeError(f"config field {name}: unsupported annotation {tp!r}")


def _integer(value: Any, name: str, bounds: Bounds) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        value, ok = int(value), True
    if not ok:
        raise ConfigError(f"{name}={value!r}: must be an integer {bounds.text()}")
    if not bounds.holds(value):
        raise ConfigError(f"{name}={value!r}: out of range; valid: {bounds.text()}")
    return int(value)


def _number(value: Any, name: str, bounds: Bounds) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name}={value!r}: must be a number {bounds.text()}")
    x = float(value)
    if math.isnan(x):
        raise ConfigError(f"{name}=nan: must be a number {bounds.text()}")
    if math.isinf(x) and not _allows_inf(bounds, x):
        raise ConfigError(f"{name}={value!r}: must be a finite number {bounds.text()} (a value beyond "
                          f"about 1.8e308 reads as inf)")
    if not bounds.holds(x):
        raise ConfigError(f"{name}={value!r}: out of range; valid: {bounds.text()}")
    return x


def _allows_inf(bounds: Bounds, x: float) -> bool:
    """+inf passes only when the field says so with lt/le = inf (an explicit 'no cap')."""
    return x > 0 and (bounds.le == math.inf or bounds.lt == math.inf)


def _describe(tp: Any, bounds: Bounds) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a, bounds) for a in args)
    if tp is type(None):
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(map(_show, args))
    if tp is int:
        return f"an integer {bounds.text()}"
    if tp is float:
        return f"a number {bounds.text()}"
    if tp is bool:
        return "true or false"
    if origin in (tuple, list):
        return "a list"
    return getattr(tp, "__name__", str(tp))


def _show(choice: Any) -> str:
    if isinstance(choice, bool):
        return str(choice).lower()
    return str(choice)


def required_of(cls: type) -> tuple[str, ...]:
    """The fields of `cls` a preset must give (declared with REQUIRED)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                 and f.default_factory is dataclasses.MISSING)


def defaults_of(cls: type) -> dict:
    """The declared defaults of `cls` as a plain dict (nested dataclasses as dicts): the node a
    config group registers in Hydra's ConfigStore, so YAML presets only override it."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            v = f.default
        elif f.default_factory is not dataclasses.MISSING:
            v = f.default_factory()
        else:
            continue
        if dataclasses.is_dataclass(v):
            v = defaults_of(type(v))
        elif isinstance(v, tuple):
            v = list(v)
        out[f.name] = v
    return out
