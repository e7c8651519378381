"""The benchmark's plain reference loop: the same client work as the TFF process, without TFF.

`PlainLoop` runs an algorithm's communication rounds in this process, on one eager Keras model:
each client, one after the other, runs the engine's own client loop
(`tffl.engine.client_training.build_phased_loop`, what TFF's client computation runs) from the
broadcast weights (and its own personal variables, for a personalized algorithm); then the
example-weighted mean of the uploaded deltas is added in numpy (as `tff.aggregators.MeanFactory`).
A round kind (`SubRound`) is its phases and what it uploads; `round(datasets)` runs every kind in
turn (one `next`: RoLoRA's B round, then its A round), `round(datasets, kind)` one of them.

Both suites measure TFF against it: the default suite (`benchmarks.run`, its processes on random
backbones) and `--suite=targets` (`benchmarks.targets`, the plain twins of its TFF paths). Started
from the TFF process's initial weights, it ends at the process's weights up to float32 rounding,
which both suites check (`max_weight_diff`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import client_training
from tffl.engine import roles


@dataclasses.dataclass(frozen=True)
class SubRound:
    """One communication round kind as the plain loop runs it: local `phases` (positions in
    `model.trainable_variables`, epochs), then the deltas at `upload` are averaged."""

    name: str
    phases: tuple[tuple[tuple[int, ...], int], ...]
    upload: tuple[int, ...]


def lora_sub_rounds(spec, algorithm: str) -> tuple[SubRound, ...]:
    """The round kinds of a LoRA process of `spec` (`process.spec`): RoLoRA's B and A rounds,
    the one AB round of the others; each trains and uploads its factors and the head (the
    builders' default extra role), one epoch."""
    extra = (roles.HEAD,)
    if algorithm == "rolora":
        kinds = {"b_round": (roles.LORA_B, *extra), "a_round": (roles.LORA_A, *extra)}
    else:
        kinds = {"ab_round": (roles.LORA_A, roles.LORA_B, *extra)}
    return tuple(SubRound(name, ((tuple(spec.indices(r)), 1),), tuple(spec.indices(r)))
                 for name, r in kinds.items())


class PlainLoop:
    """Communication rounds without TFF (module docstring) on `model`, whose
    `trainable_variables` the round kinds' positions index. `personal`: positions of the
    variables each client keeps (FedRep's head). With `jit_compile` each SGD step is an
    XLA-compiled `tf.function` (the dataset loop itself cannot be compiled);
    `cache_features=False` runs a head-only phase's epochs through the whole model
    (`tffl.engine.feature_cache`'s baseline).

    `reset` sets the start; after each `round`, `trainable` holds the global weights, `personal`
    each client's personal variables and `bytes` what one client moved in it."""

    def __init__(self, model: tf.keras.Model, learning_rate: float,
                 sub_rounds: Sequence[SubRound], personal: Sequence[int] = (),
                 jit_compile: bool = False, cache_features: bool = True):
        loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.sub_rounds = {s.name: s for s in sub_rounds}
        self.personal_positions = tuple(personal)
        self._loops = {
            s.name: client_training.build_phased_loop(
                model, loss, learning_rate,
                [client_training.Phase(tuple(indices), epochs, cache_features=cache_features)
                 for indices, epochs in s.phases], jit_compile=jit_compile)
            for s in sub_rounds}
        self.trainable: list[np.ndarray] = []
        self.non_trainable: list[tf.Tensor] = []
        self.federated: list[int] = []
        self.personal: list[list[np.ndarray]] = []
        self.bytes = {"down": 0, "up": 0}

    def reset(self, trainable, non_trainable, num_clients: int = 0) -> None:
        """Starts from the given whole-model weights; each of `num_clients` clients' personal
        variables = their initial values. Only the federated variables (those some round kind
        uploads) count as broadcast, as in TFF."""
        self.trainable = [np.array(w) for w in trainable]
        self.non_trainable = [tf.constant(w) for w in non_trainable]
        self.federated = sorted({k for s in self.sub_rounds.values() for k in s.upload})
        self.personal = [[self.trainable[k].copy() for k in self.personal_positions]
                         for _ in range(num_clients)]

    @property
    def traces(self) -> int:
        """Python traces of the client loops' `tf.function`s so far."""
        return sum(loop.experimental_get_tracing_count() for loop in self._loops.values())

    def round(self, datasets: Sequence[tf.data.Dataset], kind: str | None = None) -> float:
        """One communication round of `kind` over `datasets` (client i's data is `datasets[i]`),
        or with `kind` None one `next`: every round kind in turn. Records the bytes per client;
        returns the last kind's mean train loss (its clients' last phase, example-weighted)."""
        kinds = list(self.sub_rounds) if kind is None else [kind]
        down = up = 0
        loss = float("nan")
        for name in kinds:
            sub_down, sub_up, loss = self._sub_round(self.sub_rounds[name], datasets)
            down, up = down + sub_down, up + sub_up
        self.bytes = {"down": down, "up": up}
        return loss

    def _sub_round(self, sub: SubRound, datasets) -> tuple[int, int, float]:
        """One round of kind `sub`: (bytes down, bytes up per client, mean train loss)."""
        loop = self._loops[sub.name]
        broadcast = [tf.constant(w) for w in self.trainable]
        down = sum(self.trainable[k].nbytes for k in self.federated)
        up = 0
        sums = {k: np.zeros_like(self.trainable[k]) for k in sub.upload}
        total = loss_total = 0.0
        for i, dataset in enumerate(datasets):
            start = broadcast
            if self.personal_positions:
                start = list(broadcast)
                for k, value in zip(self.personal_positions, self.personal[i]):
                    start[k] = tf.constant(value)
            out = loop(tff.learning.models.ModelWeights(list(start), list(self.non_trainable)),
                       dataset)
            values, n = out["trainable"], float(out["num_examples"])
            deltas = {k: values[k].numpy() - self.trainable[k] for k in sub.upload}
            metrics = [np.float32(out["loss_sum"]), np.float32(out["num_correct"]),
                       np.float32(n)]
            if i == 0:
                up = sum(d.nbytes for d in deltas.values()) + sum(m.nbytes for m in metrics)
            for k, d in deltas.items():
                sums[k] += n * d
            total += n
            loss_total += float(out["loss_sum"])
            if self.personal_positions:
                self.personal[i] = [values[k].numpy() for k in self.personal_positions]
        for k in sub.upload:
            self.trainable[k] = self.trainable[k] + (sums[k] / total).astype(
                self.trainable[k].dtype)
        return down, up, loss_total / total
