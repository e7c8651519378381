"""`ALGORITHMS`: the one registry of tffl's Keras-model algorithms, name -> `Algorithm`.

Each entry says its family and builds its process from a Keras model function, the clients'
input spec, the client learning rate (or a `tff.learning.optimizers.Optimizer`) and the
family's typed configuration:

| family         | algorithms                                              | config          |
|----------------|---------------------------------------------------------|-----------------|
| `lora`         | rolora, fedavg_lora, ffa_lora, flexlora, flora, rolora_ffa | `LoraConfig` |
| `personalized` | fedrep, fedper, lg_fedavg, fedavg, fedavg_ft, flute, adaptpfl, fedsa_lora | keyword options of `tffl.algorithms.personalized.build_personalized_process` |
| `linear`       | fedrep_linear, flute_linear, adaptpfl_linear, rolora_linear | `LinearConfig` |

The `linear` family has no Keras model: `build(LinearConfig(dim, rank, learning_rate, ...))`
returns the algorithm's `tffl.engine.process.Process` (stateless, a TFF `LearningProcess`, for
`fedrep_linear` and `rolora_linear`; with declared personal state for `flute_linear` and
`adaptpfl_linear`), its hyperparameters in `process.config`.

The names come from the families' own builder tables (`tffl.algorithms.lora_plans.ROUND_BUILDERS`: each
algorithm's round kinds and schedule; `tffl.algorithms.personalized.ALGORITHMS`), so this mapping is the
single list every CLI and experiment reads.

>>> sorted(name for name, a in ALGORITHMS.items() if a.family == "lora")
['fedavg_lora', 'ffa_lora', 'flexlora', 'flora', 'rolora', 'rolora_ffa']
>>> process = ALGORITHMS["rolora"].build(model_fn, input_spec, 0.1, LoraConfig())
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
from tffl.engine import roles
from tffl.algorithms import rolora_linear


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """How a federated-LoRA algorithm runs (PEFT's `LoraConfig` holds the adapter; this holds
    its federation). Defaults: the paper's plain mean and SGD server step with η_s = 1.

    Attributes:
      aggregator: a `tff.aggregators` factory for the uploads (default `MeanFactory()`).
      server_optimizer: a `tff.learning.optimizers.Optimizer` on the mean delta (default SGD 1).
      extra_roles: roles trained and aggregated with the factors every round (default `head`).
      weight_decay: λ ≥ 0, the clients' coupled L2.
      seed: FLoRA's seed for the fresh A of every round.
      rolora_fraction, total_rounds: rolora_ffa: RoLoRA for round(x·T) communication rounds of
        T, then FFA-LoRA's B rounds.
      client_ranks: flexlora, flora: each client's rank (`{client id: rank}` or a function).
      averaging_error: fedavg_lora: report ‖Ā·B̄ − mean(A_iB_i)‖_F / ‖mean(A_iB_i) − A·B‖_F.
      jit_compile: mark each client step for XLA.
    """

    aggregator: Any = None
    server_optimizer: Any = None
    extra_roles: tuple[str, ...] = (roles.HEAD,)
    weight_decay: float = 0.0
    seed: int = 0
    rolora_fraction: float = 0.5
    total_rounds: int | None = None
    client_ranks: Any = None
    averaging_error: bool = False
    jit_compile: bool = False

    def options(self, name: str) -> dict[str, Any]:
        """`tffl.algorithms.lora_fl.build_schedule`'s keyword arguments for algorithm `name`."""
        options = dict(aggregator=self.aggregator, server_optimizer=self.server_optimizer,
                       extra_roles=tuple(self.extra_roles), weight_decay=self.weight_decay,
                       jit_compile=self.jit_compile)
        if name == "flora":
            options["seed"] = self.seed
        if self.client_ranks is not None:
            options["client_ranks"] = self.client_ranks
        if self.averaging_error:
            options["averaging_error"] = True
        return options


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
    """One registry entry: `build(keras_model_fn, input_spec, client_learning_rate, config=None,
    **model)` returns the process; `model` takes the model's own options (`loss_fn`,
    `initial_non_trainable`, `initial_trainable`, `frozen_dir`, `client_device`)."""

    name: str
    family: str
    build: Callable[..., Any]


def _lora_builder(name: str) -> Callable[..., Any]:
    def build(keras_model_fn, input_spec, client_learning_rate, config: LoraConfig | None = None,
              **model):
        config = config or LoraConfig()
        if not isinstance(config, LoraConfig):
            raise TypeError(f"{name} takes a tffl.algorithms.registry.LoraConfig, got "
                            f"{type(config).__name__}")
        options = {**config.options(name), **model}
        if name == "rolora_ffa":
            if config.total_rounds is None:
                raise ValueError("rolora_ffa needs LoraConfig(total_rounds=T): it switches to "
                                 "FFA-LoRA after round(rolora_fraction·T) communication rounds")
            return lora_fl.build_rolora_then_ffa(config.rolora_fraction, config.total_rounds,
                                                 keras_model_fn, input_spec,
                                                 client_learning_rate, **options)
        return lora_fl.build_schedule(name, keras_model_fn, input_spec, client_learning_rate,
                                      **options)

    return build


def _personalized_builder(name: str) -> Callable[..., Any]:
    def build(keras_model_fn, input_spec, client_learning_rate, config: Mapping | None = None,
              **model):
        return personalized.build_personalized_process(
            name, keras_model_fn, input_spec, client_learning_rate, **dict(config or {}),
            **model)

    return build


def _linear_builder(name: str) -> Callable[..., Any]:
    builder = LINEAR_BUILDERS[name]

    def build(config: LinearConfig):
        if not isinstance(config, LinearConfig):
            raise TypeError(f"{name} takes a tffl.algorithms.registry.LinearConfig, got "
                            f"{type(config).__name__}")
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
               for n in personalized.ALGORITHMS]
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


__all__ = ["ALGORITHMS", "Algorithm", "LINEAR_BUILDERS", "LinearConfig", "LoraConfig", "get"]
