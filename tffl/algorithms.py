"""`ALGORITHMS`: the one registry of tffl's Keras-model algorithms, name -> `Algorithm`.

Each entry says its family and builds its process from a Keras model function, the clients'
input spec, the client learning rate (or a `tff.learning.optimizers.Optimizer`) and the
family's typed configuration:

| family         | algorithms                                              | config          |
|----------------|---------------------------------------------------------|-----------------|
| `lora`         | rolora, fedavg_lora, ffa_lora, flexlora, flora, rolora_ffa | `LoraConfig` |
| `personalized` | fedrep, fedper, lg_fedavg, fedavg, fedavg_ft, flute, adaptpfl, fedsa_lora | keyword options of `tffl.personalized.build_personalized_process` |

The names come from the families' own builder tables (`tffl.lora_plans.ROUND_BUILDERS`: each
algorithm's round kinds and schedule; `tffl.personalized.ALGORITHMS`), so this mapping is the
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

from tffl import lora_fl
from tffl import lora_plans
from tffl import personalized
from tffl import roles


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
        """`tffl.lora_fl.build_schedule`'s keyword arguments for algorithm `name`."""
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
            raise TypeError(f"{name} takes a tffl.algorithms.LoraConfig, got "
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


def _registry() -> dict[str, Algorithm]:
    entries = [Algorithm(n, "personalized", _personalized_builder(n))
               for n in personalized.ALGORITHMS]
    entries += [Algorithm(n, "lora", _lora_builder(n)) for n in lora_plans.ROUND_BUILDERS]
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


__all__ = ["ALGORITHMS", "Algorithm", "LoraConfig", "get"]
