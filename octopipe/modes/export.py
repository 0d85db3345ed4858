"""`mode=export plan=PATH target=<stack>`: an existing plan.json as the files that stack reads
(`export/` of the run directory), refused in one line naming the rule the plan breaks.

The model (`model=`) must be the one the plan was made for: its module names go into the files.
A user's model (`model=module`, `model=hf`; planned by mode=train) has one module per block.
`target=octopipe` writes every stack that runs the plan as it is, and names the others.
"""
from __future__ import annotations

from pathlib import Path

from octopipe.errors import ConfigError
from octopipe.interop.export import EXPORT_TARGETS, ExportError, runnable_by
from octopipe.modes.inputs import Inputs
from octopipe.modes.mode_result import Result
from octopipe.modes.simulate import check_file_work
from octopipe.modes.targeting import export_artifacts, units_of
from octopipe.plan import plan_model
from octopipe.plan_io import load_plan


def run(inputs: Inputs) -> Result:
    cfg = inputs.config
    if not cfg.plan:
        raise ConfigError("plan: mode=export needs plan=PATH (a plan.json written by mode=plan)")
    path = Path(cfg.plan)
    if path.suffix.lower() != ".json":
        raise ConfigError(f"plan={cfg.plan!r}: give a plan.json (a torch CSV holds no partition)")
    check_file_work(cfg, path)
    plan = load_plan(path)
    user = bool(cfg.model.factory or cfg.model.hf)   # planned by mode=train: one layer per block
    if not user:
        model = inputs.costed_model
        if plan.model and plan.model != model.name:
            raise ConfigError(f"plan={cfg.plan!r} was made for model {plan.model!r}, not {model.name!r}; "
                              f"set model={plan.model}")
        plan_model(model, plan)              # the layer counts agree (pieces included)
    units = units_of(inputs, plan.n_layers if user else None)
    targets = EXPORT_TARGETS if cfg.target == "octopipe" else (cfg.target,)
    arts, why = export_artifacts(plan, targets, units, cfg.model.micro_batch_size)
    if cfg.target != "octopipe" and why:
        raise ExportError(why[cfg.target])
    report = [f"{name}: export/ written" if name not in why else f"[yellow]{name}[/]: {why[name]}"
              for name in targets]
    summary = {"plan": str(path), "target": cfg.target, "model": plan.model or cfg.model.name,
               "export": [a.name for a in arts],
               "runnable_by": {k: (v or "yes") for k, v in runnable_by(plan, units).items()}}
    return Result(summary, tuple(report), tuple(arts))
