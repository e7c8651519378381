"""`ALGORITHMS`: the one registry of tffl's algorithms, name -> `Algorithm`.

Each entry says its family and builds its process from the family's typed configuration, with
one signature for every family, `build(config)`:

| family         | algorithms                                              | config          |
|----------------|---------------------------------------------------------|-----------------|
| `lora`         | rolora, fedavg_lora, ffa_lora, flexlora, flora, rolora_ffa | `tffl.algorithms.lora_plans.FederatedLoraConfig` |
| `personalized` | fedrep, fedper, lg_fedavg, fedavg, fedavg_ft, flute, adaptpfl, fedsa_lora | `tffl.algorithms.personalized_builders.PersonalizedConfig` |
| `linear`       | fedrep_linear, flute_linear, adaptpfl_linear, rolora_linear | `LinearConfig` |

The Keras families' configurations carry the model (`tffl.engine.federated_model.ModelSource`)
and the client optimizer; the `linear` family has no Keras model: `LinearConfig(dim, rank,
learning_rate, ...)` gives the problem size. Each returns the algorithm's
`tffl.engine.process.Process` (stateless, a TFF `LearningProcess`, or with declared personal
state).

The names come from the families' own builder tables (`tffl.algorithms.lora_plans.ROUND_BUILDERS`:
each algorithm's round kinds and schedule; `tffl.algorithms.personalized.PERSONALIZED_ALGORITHMS`),
so this mapping is the single list every CLI and experiment reads.

>>> sorted(name for name, a in ALGORITHMS.items() if a.family == "lora")
['fedavg_lora', 'ffa_lora', 'flexlora', 'flora', 'rolora', 'rolora_ffa']
>>> from tffl.algorithms.lora_plans import FederatedLoraConfig
>>> from tffl.engine.federated_model import ModelSource
>>> config = FederatedLoraConfig(ModelSource(model_fn, input_spec), 0.1)
>>> process = ALGORITHMS["rolora"].build(config)
>>> process.data_names                         # `next`: a B round then an A round
('b_round', 'a_round')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from tffl.algorithms import adaptpfl_linear
from tffl.algorithms import fedrep_linear
from tffl.algorithms import flute_linear
from tffl.algorithms import lora_fl
from tffl.algorithms import lora_plans
from tffl.algorithms import personalized
from tffl.algorithms import rolora_linear
from tffl.algorithms.personalized_builders import PersonalizedConfig


@dataclasses.dataclass(frozen=True)
class LinearConfig:
    """A linear algorithm's problem size and step (the papers' synthetic linear models: client
    i's predictor θ_i = B·w_i with a shared d×k representation B; RoLoRA's Algorithm 2 on a
    rank-1 ΔW = a·bᵀ).

    Attributes:
      dim: d >= 1.
      rank: k, 1 <= k <= d (`rolora_linear`: 1).
      learning_rate: η > 0, the representation's step.
      seed: the initial representation's seed.
      options: the algorithm's own keyword arguments (e.g. FLUTE's `gamma1`, AdaptPFL's
        `alpha`), as its builder in `LINEAR_BUILDERS` names them (AdaptPFL: the fields of its
        `AdaptPFLLinearConfig`).
    """

    dim: int
    rank: int
    learning_rate: float
    seed: int = 0
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


# The linear algorithms: name -> builder (`tffl.<name>`; RoLoRA's Alt-min-GD is rank 1), each
# returning a `tffl.engine.process.Process`.
LINEAR_BUILDERS: Mapping[str, Callable[..., Any]] = {
    "fedrep_linear": fedrep_linear.build_fedrep_linear,
    "flute_linear": flute_linear.build_flute_linear,
    "adaptpfl_linear": adaptpfl_linear.build_adaptpfl_linear,
    "rolora_linear": rolora_linear.build_rolora_alt_min_gd,
}


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One registry entry: `build(config)` returns the process, `config` the family's
    configuration (`CONFIGS[family]`)."""

    name: str
    family: str
    build: Callable[[Any], Any]


# Each family's configuration class.
CONFIGS = {"lora": lora_plans.FederatedLoraConfig, "personalized": PersonalizedConfig,
           "linear": LinearConfig}


def _checked(name: str, family: str, config) -> None:
    expected = CONFIGS[family]
    if not isinstance(config, expected):
        raise TypeError(f"{name} takes a {expected.__module__}.{expected.__name__}, got "
                        f"{type(config).__name__}")


def _lora_builder(name: str) -> Callable[[Any], Any]:
    def build(config: lora_plans.FederatedLoraConfig):
        _checked(name, "lora", config)
        return lora_fl.build_schedule(name, config)

    return build


def _personalized_builder(name: str) -> Callable[[Any], Any]:
    def build(config: PersonalizedConfig):
        _checked(name, "personalized", config)
        return personalized.build_personalized(name, config)

    return build


def _linear_builder(name: str) -> Callable[..., Any]:
    builder = LINEAR_BUILDERS[name]

    def build(config: LinearConfig):
        _checked(name, "linear", config)
        if name == "rolora_linear":
            if config.rank != 1:
                raise ValueError(f"rolora_linear is RoLoRA's rank-1 Alt-min-GD: rank="
                                 f"{config.rank} must be 1")
            return builder(config.dim, learning_rate=config.learning_rate, seed=config.seed,
                           **config.options)
        if name == "adaptpfl_linear":
            return builder(adaptpfl_linear.AdaptPFLLinearConfig(
                config.dim, config.rank, learning_rate=config.learning_rate, seed=config.seed,
                **config.options))
        return builder(config.dim, config.rank, learning_rate=config.learning_rate,
                       seed=config.seed, **config.options)

    return build


def _registry() -> dict[str, Algorithm]:
    entries = [Algorithm(n, "personalized", _personalized_builder(n))
               for n in personalized.PERSONALIZED_ALGORITHMS]
    entries += [Algorithm(n, "lora", _lora_builder(n)) for n in lora_plans.ROUND_BUILDERS]
    entries += [Algorithm(n, "linear", _linear_builder(n)) for n in LINEAR_BUILDERS]
    return {entry.name: entry for entry in entries}


ALGORITHMS: Mapping[str, Algorithm] = _registry()


def get(name: str) -> Algorithm:
    """The entry of algorithm `name`.

    Raises:
      ValueError: an unknown name, listing the known ones.
    """
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


__all__ = ["ALGORITHMS", "Algorithm", "CONFIGS", "LINEAR_BUILDERS", "LinearConfig", "get"]
