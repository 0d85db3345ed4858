"""The training's parallel layout (train.dp x train.tp x train.pp), checked before any process
starts: one line naming the field and the fix for each thing the run cannot do."""
from __future__ import annotations

from dataclasses import dataclass

from octopipe.config.schema import Config
from octopipe.errors import ConfigError
from octopipe.layers.tensor_parallel import tp_problem
from octopipe.model.spec import ModelSpec
from octopipe.model.user_module import UserBlocks
from octopipe.runtime.hf_tensor_parallel import check_hf_tp, hf_ref


@dataclass(frozen=True)
class TrainLayout:
    """`dp` replicas of a `pp`-rank pipeline whose stages are `tp` ranks wide; `zero`: AdamW state
    sharded over each stage's replicas."""

    pp: int
    dp: int = 1
    tp: int = 1
    zero: bool = False

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.tp

    def describe(self) -> str:
        parts = [f"dp {self.dp}" if self.dp > 1 else "", f"tp {self.tp}" if self.tp > 1 else "", f"pp {self.pp}"]
        return " x ".join(p for p in parts if p) + (" (ZeRO-1)" if self.zero else "")


def train_layout(cfg: Config) -> TrainLayout:
    """The layout train.* asks for, refused in one line when the local launch cannot run it."""
    t = cfg.train
    layout = TrainLayout(t.pp, t.dp, t.tp, bool(t.zero))
    if layout.zero and layout.dp < 2:
        raise ConfigError(f"train.zero=1 shards AdamW state over data-parallel replicas, and train.dp={t.dp}; "
                          f"set train.dp >= 2 or train.zero=0")
    check_world(cfg, layout.world, f"train.dp={t.dp} x train.tp={t.tp} x train.pp={t.pp}")
    return layout


def check_world(cfg: Config, world: int, what: str) -> None:
    """Refuse a local launch of more than runtime.max_ranks processes (`what`: where the count
    came from, for the message)."""
    if world > cfg.runtime.max_ranks:
        raise ConfigError(f"{what} = {world} processes, more than runtime.max_ranks={cfg.runtime.max_ranks} on this "
                          f"machine; lower them, raise runtime.max_ranks, or run under torchrun on several machines "
                          f"(docs/training.md)")


def check_model(cfg: Config, layout: TrainLayout, model: ModelSpec | None, blocks: UserBlocks | None = None) -> None:
    """What the layout needs of the model and the run: TP splits a preset's layers or a model=hf
    decoder's (`model` None: `blocks`, a user's; other factories cannot be split), every split
    width divisible by tp."""
    t = cfg.train
    if layout.tp > 1:
        if model is None:
            if blocks is None or hf_ref(blocks) is None:
                raise ConfigError(f"train.tp={t.tp}: a user's blocks (model.factory) cannot be split across TP "
                                  f"ranks (TP needs layers it can split: a preset's or a model=hf decoder's); use "
                                  f"train.tp=1, or train a preset (train.model=<preset>)")
            check_hf_tp(blocks, layout.tp)
        elif model.layers and model.layers[0].hidden % layout.tp:
            raise ConfigError(f"train.tp={t.tp} does not divide {model.name}'s hidden size "
                              f"{model.layers[0].hidden}; choose a divisor")
        for spec in model.layers if model is not None else ():
            problem = tp_problem(spec, layout.tp, model.vocab)
            if problem is not None:
                raise ConfigError(f"train.{problem} of {model.name}; choose a tp that divides it")
