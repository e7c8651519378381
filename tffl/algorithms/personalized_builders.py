"""The options and per-algorithm builders behind `tffl.algorithms.personalized.build_personalized_process`.

`PersonalizedConfig` groups the process's options (epochs, LoRA schedule, FLUTE's and AdaptPFL's
configs, client and server training, initial and frozen weights); `PersonalizedConfig.resolved`
checks them against an algorithm and fills the algorithm's defaults. `BUILDERS` maps each
algorithm's name to its builder, `builder(algorithm, split, config, input_spec) -> Plan`: from the
model's variables by role (`Split`) it decides the personal variables, the clients' local phases
and FLUTE's hook, and lays the phases out as communication rounds by `config.lora_schedule`
(`LORA_SCHEDULE_ROUNDS`: one "round", or RoLoRA-style alternating "b_round" / "a_round"). The module
docstring of `tffl.algorithms.personalized` describes the algorithms.

>>> PersonalizedConfig().resolved("fedavg_ft").finetune_epochs
10
>>> PersonalizedConfig(head_epochs=0)
Traceback (most recent call last):
...
ValueError: head_epochs (τ_h)=0 must be an integer >= 1
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from tffl.algorithms import adaptpfl
from tffl.algorithms import lora_plans
from tffl.algorithms.adaptpfl import AdaptPFLConfig
from tffl.algorithms.flute import FluteConfig, FluteHook
from tffl.engine import client_training
from tffl.engine import model_spec
from tffl.engine import roles
from tffl.engine import schedules
from tffl.engine.federated_model import ModelSource
from tffl.engine.rounds import RoundSpec

REPRESENTATION_ROLES = (roles.SHARED, roles.LORA_A, roles.LORA_B)
PERSONAL_ROLES = (roles.HEAD,)
Indices = tuple[int, ...]


def _check_epochs(name: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise ValueError(f"{name}={value} must be an integer >= {minimum}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class PersonalizedConfig:
    """The options of `build_personalized_process`, checked on construction (epoch counts are
    stored as ints). `None` means "the algorithm's default", filled in by `resolved`.

    Attributes:
      local_epochs: E ≥ 1, epochs of joint training (FedPer, LG-FedAvg, FedAvg, FedAvg-FT,
        FedSA-LoRA, plain FLUTE). Default 1.
      head_epochs: τ_h ≥ 1, FedRep's (FLUTE*'s, AdaptPFL's τ_w) head epochs per round; default
        None, i.e. 1; plain FLUTE has no head-only epochs and refuses it.
      representation_epochs: τ_r ≥ 1, FedRep's (FLUTE's, AdaptPFL's τ_b) representation epochs
        per round. Default 1.
      representation_blocks: R ≥ 1, FedRep's (head τ_h, representation τ_r) blocks per round,
        interleaved: R = 5 is SRPFL's code on CIFAR-100/EMNIST/FEMNIST (`local_rep_ep`), 5 × (10
        head epochs + 1 representation epoch); default 1 (FedRep's paper); only for `fedrep`.
      shortcut_epochs: τ_s ≥ 1, AdaptPFL's shortcut epochs (between the head and the
        representation phases). Default 1.
      finetune_epochs: E_ft ≥ 0, head fine-tuning epochs before evaluation; default None, i.e.
        10 for `fedavg_ft` (srpfl.md §6.4) and 0 otherwise (`fedavg` must keep 0).
      lora_schedule: "joint" (default) or "alternating" (RoLoRA-style B then A rounds; needs
        LoRA factors; not for `fedsa_lora`).
      flute: FLUTE's regularizers; default None, i.e. `FluteConfig()` (the official code's
        values) for `flute`; only for `algorithm="flute"`.
      adaptpfl: AdaptPFL's variant and ablation switches; default None, i.e. `AdaptPFLConfig()`
        (variant A, `tffl.algorithms.adaptpfl`) for `adaptpfl`; only for `algorithm="adaptpfl"`.
      weight_decay: λ ≥ 0, the clients' coupled L2 (g + λθ). Default 0.
      jit_compile: mark each local step for XLA (`tffl.engine.client_hooks.ClientConfig`). Default False.
      aggregator: a `tff.aggregators` factory for the deltas; default None, `MeanFactory()`.
      server_learning_rate: η_s > 0 of the default server optimizer, φ ← φ + η_s·agg(Δ_i).
        Default 1.
      server_optimizer: a `tff.learning.optimizers.Optimizer` instead of SGD with η_s (default
        None).
      model: the Keras model (`tffl.engine.federated_model.ModelSource`: its function, input
        spec, loss and starting weights); needed to build (`build_personalized`).
      client_optimizer: local SGD step η > 0, or a `tff.learning.optimizers.Optimizer`; needed to
        build.
    """

    local_epochs: int = 1
    head_epochs: int | None = None
    representation_epochs: int = 1
    representation_blocks: int = 1
    shortcut_epochs: int = 1
    finetune_epochs: int | None = None
    lora_schedule: str = "joint"
    flute: FluteConfig | None = None
    adaptpfl: AdaptPFLConfig | None = None
    weight_decay: float = 0.0
    jit_compile: bool = False
    aggregator: Any = None
    server_learning_rate: float = 1.0
    server_optimizer: Any = None
    model: ModelSource | None = None
    client_optimizer: Any = None

    def __post_init__(self):
        if self.lora_schedule not in LORA_SCHEDULES:
            raise ValueError(f"lora_schedule={self.lora_schedule!r} must be one of "
                             f"{', '.join(LORA_SCHEDULES)}")
        if not (np.isfinite(self.server_learning_rate) and self.server_learning_rate > 0):
            raise ValueError(f"server_learning_rate={self.server_learning_rate} must be a finite "
                             "number > 0")
        epochs = [("local_epochs", "local_epochs", 1), ("head_epochs", "head_epochs (τ_h)", 1),
                  ("representation_epochs", "representation_epochs (τ_r)", 1),
                  ("shortcut_epochs", "shortcut_epochs (τ_s)", 1),
                  ("representation_blocks", "representation_blocks", 1),
                  ("finetune_epochs", "finetune_epochs", 0)]
        for field, name, minimum in epochs:
            if getattr(self, field) is not None:
                object.__setattr__(self, field, _check_epochs(name, getattr(self, field), minimum))

    def resolved(self, algorithm: str) -> PersonalizedConfig:
        """This config for `algorithm`: the options that do not apply to it refused, the `None`
        defaults filled in."""
        if algorithm == "flute" and self.flute is not None and self.flute.variant == "plain" and (
                self.head_epochs is not None):
            raise ValueError(f"head_epochs={self.head_epochs}: plain FLUTE (the paper's Algorithm "
                             "2) has no head-only epochs; use local_epochs, or variant='star' "
                             "(FLUTE*)")
        if self.representation_blocks > 1 and algorithm != "fedrep":
            raise ValueError(f"representation_blocks={self.representation_blocks} interleaves "
                             f"FedRep's head and representation epochs; it does not apply to "
                             f"{algorithm!r}")
        if self.flute is not None and algorithm != "flute":
            raise ValueError(f"flute regularizers were given for algorithm {algorithm!r}; they "
                             "apply only to 'flute'")
        if self.adaptpfl is not None and algorithm != "adaptpfl":
            raise ValueError(f"an AdaptPFLConfig was given for algorithm {algorithm!r}; it "
                             "applies only to 'adaptpfl'")
        finetune_epochs = self.finetune_epochs
        if finetune_epochs is None:
            finetune_epochs = 10 if algorithm == "fedavg_ft" else 0
        if algorithm == "fedavg" and finetune_epochs:
            raise ValueError("fedavg evaluates the global model as it is; for head fine-tuning "
                             "before evaluation use fedavg_ft")
        return dataclasses.replace(
            self, head_epochs=1 if self.head_epochs is None else self.head_epochs,
            finetune_epochs=finetune_epochs,
            flute=FluteConfig() if algorithm == "flute" and self.flute is None else self.flute,
            adaptpfl=(AdaptPFLConfig() if algorithm == "adaptpfl" and self.adaptpfl is None
                      else self.adaptpfl))


@dataclasses.dataclass(frozen=True)
class Split:
    """The model's trainable variables by role, as positions in `spec.trainable`: `head` (the
    personal role), `shortcut` (AdaptPFL's) and `representation` (`REPRESENTATION_ROLES`)."""

    spec: model_spec.ModelSpec
    head: Indices
    shortcut: Indices
    representation: Indices

    @classmethod
    def of(cls, spec: model_spec.ModelSpec) -> Split:
        return cls(spec, spec.indices(PERSONAL_ROLES), spec.indices([roles.SHORTCUT]),
                   spec.indices(REPRESENTATION_ROLES))

    @property
    def layout(self) -> str:
        """The trainable variables as `name:role` pairs, for error messages."""
        return ", ".join(f"{v.name}:{v.role}" for v in self.spec.trainable) or "none"

    def require(self, algorithm: str, personal: bool = True) -> None:
        """Refuses a split without personal variables or representation (if `personal`), or
        with nothing trainable."""
        if personal and not self.head:
            raise ValueError(
                f"{algorithm} needs personal variables (role {roles.HEAD!r}: the head, or "
                f"LG-FedAvg's local layers) but the model has none; tag them with "
                f"tffl.engine.roles.tag_layer(layer, {roles.HEAD!r}). Trainable variables: {self.layout}")
        if personal and not self.representation:
            raise ValueError(
                f"{algorithm} needs a representation to aggregate (trainable variables with "
                f"roles {', '.join(REPRESENTATION_ROLES)}) but the model has none. Trainable "
                f"variables: {self.layout}")
        if not self.head + self.representation:
            raise ValueError(f"{algorithm}: the model has no trainable variables to train")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a builder decides: the communication rounds (`tffl.engine.rounds.RoundSpec`s named by
    `schedule`), the `personal` variables (the clients' state), the `head` that evaluation
    fine-tunes, and the client `hook` (FLUTE's, else None)."""

    round_specs: tuple[RoundSpec, ...]
    schedule: Callable[[int], str]
    personal: Indices
    head: Indices
    hook: FluteHook | None = None


def _joint_rounds(split: Split, representation: Indices):
    return {"round": representation}, schedules.constant("round")


def _alternating_rounds(split: Split, representation: Indices):
    a_idx, b_idx = split.spec.indices([roles.LORA_A]), split.spec.indices([roles.LORA_B])
    if not a_idx or not b_idx:
        raise ValueError("lora_schedule='alternating' alternates the LoRA factors, but the "
                         f"model has no trainable lora_a/lora_b variables: {split.layout}")
    lora_plans.lora_pairs(split.spec)
    others = tuple(k for k in representation if k not in a_idx + b_idx)
    rep_sets = {"b_round": tuple(sorted(others + b_idx)), "a_round": tuple(sorted(others + a_idx))}
    return rep_sets, schedules.alternating("b_round", "a_round")


# {lora_schedule: (split, representation) -> ({round kind: representation it trains}, schedule)}
LORA_SCHEDULE_ROUNDS = {"joint": _joint_rounds, "alternating": _alternating_rounds}
LORA_SCHEDULES = tuple(LORA_SCHEDULE_ROUNDS)


def _plan(split: Split, config: PersonalizedConfig,
          phases: Callable[[Indices], tuple[client_training.Phase, ...]], personal: Indices,
          hook: FluteHook | None = None) -> Plan:
    """One round spec per round kind of `config.lora_schedule`, with `phases(representation)`."""
    rep_sets, schedule = LORA_SCHEDULE_ROUNDS[config.lora_schedule](split, split.representation)
    round_specs = tuple(RoundSpec(name, phases(rep)) for name, rep in rep_sets.items())
    return Plan(round_specs, schedule, tuple(personal), split.head, hook)


def _joint(split: Split, epochs: int):
    """One phase training the head and representation together."""
    return lambda rep: (client_training.Phase(tuple(sorted(split.head + rep)), epochs),)


def build_fedrep(algorithm: str, split: Split, config: PersonalizedConfig, input_spec) -> Plan:
    """FedRep: R × (head τ_h epochs, then representation τ_r epochs); the head is personal."""
    split.require(algorithm)

    def phases(rep):
        return (client_training.Phase(split.head, config.head_epochs),
                client_training.Phase(rep, config.representation_epochs)
                ) * config.representation_blocks

    return _plan(split, config, phases, split.head)


def build_fedper(algorithm: str, split: Split, config: PersonalizedConfig, input_spec) -> Plan:
    """FedPer and LG-FedAvg: head and representation jointly for E epochs; the head (LG-FedAvg:
    the lower layers, tagged `head`) is personal."""
    split.require(algorithm)
    return _plan(split, config, _joint(split, config.local_epochs), split.head)


def build_fedavg(algorithm: str, split: Split, config: PersonalizedConfig, input_spec) -> Plan:
    """FedAvg and FedAvg-FT: everything jointly for E epochs, all of it aggregated (FedAvg-FT
    also needs the head its evaluation fine-tunes)."""
    split.require(algorithm, personal=algorithm == "fedavg_ft")
    return _plan(split, config, _joint(split, config.local_epochs), ())


def build_flute(algorithm: str, split: Split, config: PersonalizedConfig, input_spec) -> Plan:
    """FLUTE: plain (the paper's Algorithm 2: head and representation jointly for E epochs) or
    FLUTE* (the official code: head τ_h epochs, then jointly τ_r epochs), with FLUTE's hook."""
    split.require(algorithm)
    hook = flute_hook(split, config.flute, input_spec)
    if config.flute.variant == "plain":
        return _plan(split, config, _joint(split, config.local_epochs), split.head, hook)

    def phases(rep):
        return (client_training.Phase(split.head, config.head_epochs),
                client_training.Phase(tuple(sorted(split.head + rep)),
                                      config.representation_epochs))

    return _plan(split, config, phases, split.head, hook)


def build_adaptpfl(algorithm: str, split: Split, config: PersonalizedConfig, input_spec) -> Plan:
    """AdaptPFL: head τ_w, shortcut τ_s, then representation τ_b epochs (`tffl.algorithms.adaptpfl`); the
    head and the shortcut are personal."""
    split.require(algorithm)
    if not split.shortcut:
        raise ValueError(
            f"adaptpfl needs a personal shortcut (variables with role {roles.SHORTCUT!r}), but "
            "the model has none: build it with a shortcut branch, e.g. "
            f"models.paper_models.build_mlp(shortcut_alpha=α). Trainable variables: "
            f"{split.layout}")

    def phases(rep):
        return adaptpfl.phases(config.adaptpfl, split.spec, split.head, split.shortcut,
                                      rep, config.head_epochs, config.shortcut_epochs,
                                      config.representation_epochs)

    return _plan(split, config, phases, tuple(sorted(split.head + split.shortcut)))


def build_fedsa_lora(algorithm: str, split: Split, config: PersonalizedConfig, input_spec) -> Plan:
    """FedSA-LoRA: FedPer's schedule with the B factors personal and the A factors (and any
    head or `shared` variable) aggregated."""
    a_idx, b_idx = split.spec.indices([roles.LORA_A]), split.spec.indices([roles.LORA_B])
    if not a_idx or not b_idx:
        raise ValueError(
            "fedsa_lora shares the LoRA A factors and keeps the B factors personal, but the "
            f"model has no trainable lora_a/lora_b variables (use a LoRA model, e.g. "
            f"representation=lora). Trainable variables: {split.layout}")
    if config.lora_schedule != "joint":
        raise ValueError("fedsa_lora trains A and B together (lora_schedule='joint'); "
                         "alternating rounds would leave the personal B untrained half the time")
    # The head (if any) is averaged with A; B is the personal state.
    split = dataclasses.replace(
        split, head=b_idx,
        representation=tuple(sorted(set(split.representation + split.head) - set(b_idx))))
    split.require(algorithm)
    return _plan(split, config, _joint(split, config.local_epochs), split.head)


def flute_hook(split: Split, flute: FluteConfig, input_spec) -> FluteHook:
    """FLUTE's client hook on the head's one kernel H (k×m, m ≥ 2 classes, integer labels)."""
    spec, head = split.spec, split.head
    kernels = [k for k in head if len(spec.trainable[k].shape) == 2]
    if len(kernels) != 1:
        raise ValueError(f"flute needs exactly one head kernel H (k×m), found "
                         f"{[spec.trainable[k].name for k in kernels]}")
    kernel_index = kernels[0]
    num_classes = spec.trainable[kernel_index].shape[1]
    if num_classes < 2:
        raise ValueError(f"flute's neural-collapse term needs m >= 2 classes, the head "
                         f"kernel {spec.trainable[kernel_index].name} has {num_classes}")
    y_spec = model_spec.split_batch(input_spec)[1]
    if not y_spec.dtype.is_integer:
        raise ValueError(f"flute needs integer class labels, got {y_spec.dtype.name}")
    return FluteHook(flute, kernel_index, num_classes, head)


# {algorithm: builder}, in the order of `tffl.algorithms.personalized.PERSONALIZED_ALGORITHMS`.
BUILDERS: dict[str, Callable[..., Plan]] = {
    "fedrep": build_fedrep,
    "fedper": build_fedper,
    "lg_fedavg": build_fedper,
    "fedavg": build_fedavg,
    "fedavg_ft": build_fedavg,
    "flute": build_flute,
    "adaptpfl": build_adaptpfl,
    "fedsa_lora": build_fedsa_lora,
}
