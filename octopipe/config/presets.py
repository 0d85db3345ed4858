"""A preset file (conf/<group>/<name>.yaml) as its typed section, without composing a config:
for tools that build one model or cluster by name (benchmarks, the solver comparison)."""
from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from octopipe.config.convert import convert
from octopipe.config.loader import cost_config
from octopipe.config.store import GROUP_SCHEMAS
from octopipe.errors import ConfigError
from octopipe.io import CONF_DIR, preset_names


def _schema_source(raw: dict) -> str:
    """The cost source a cost preset's defaults list names (`profiled_schema` -> profiled)."""
    names = [d for d in raw.get("defaults", ()) if isinstance(d, str) and d.endswith("_schema")]
    return names[0].removesuffix("_schema") if names else "analytic"


def preset(group: str, name: str) -> Any:
    """The typed section of preset `name` of `group` (its schema's defaults filled in)."""
    path = CONF_DIR / group / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown {group} preset {name!r}; valid: {', '.join(preset_names(group))}")
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if group == "cost":
        return cost_config({"source": _schema_source(raw), **raw})
    if group not in GROUP_SCHEMAS:
        raise ConfigError(f"{group}: no typed preset group; valid: {', '.join(GROUP_SCHEMAS)}, cost")
    return convert(GROUP_SCHEMAS[group], raw, f"{group}.")
