"""The benchmark's baseline: the same client work as the TFF process, without TFF.

`PlainClient` calls the engine's own client loop (`tffl.engine.client_training.build_phased_loop`) in
this process; `PlainRunner` runs an algorithm's sub-rounds over the clients one after the other
and takes the example-weighted mean of the uploaded deltas in numpy (as
`tff.aggregators.MeanFactory`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from experiments.benchmark.build import Built
from experiments.benchmark.config import Config
from tffl.engine import client_training


class PlainClient:
    """The client work of one sub-round without TFF: the engine's own client loop,
    `tffl.engine.client_training.build_phased_loop` (what TFF's client computation runs), called in this
    process on `model`. `run(trainable, non_trainable, dataset)` assigns the weights, runs each
    phase's `epochs` passes of SGD on the phase's variables and returns `(trainable values,
    loss_sum, num_correct, num_examples)`. With `jit_compile` each SGD step is an XLA-compiled
    `tf.function` (the dataset loop itself cannot be compiled). `cache_features=False` runs a
    head-only phase's epochs through the whole model (`tffl.engine.feature_cache`'s baseline)."""

    def __init__(self, model: tf.keras.Model, learning_rate: float,
                 phases: Sequence[tuple[tuple[int, ...], int]], jit_compile: bool,
                 cache_features: bool = True):
        self._loop = client_training.build_phased_loop(
            model, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            learning_rate, [client_training.Phase(tuple(indices), epochs,
                                                  cache_features=cache_features)
                            for indices, epochs in phases], jit_compile=jit_compile)

    @property
    def traces(self) -> int:
        """Python traces of the loop's `tf.function` so far."""
        return self._loop.experimental_get_tracing_count()

    def run(self, trainable_values, non_trainable_values, dataset):
        out = self._loop(tff.learning.models.ModelWeights(list(trainable_values),
                                                          list(non_trainable_values)), dataset)
        return out["trainable"], out["loss_sum"], out["num_correct"], out["num_examples"]


class PlainRunner:
    """Runs one algorithm's rounds with the plain loop: clients one after the other, then the
    example-weighted mean of the uploaded deltas (as `tff.aggregators.MeanFactory`), in numpy."""

    def __init__(self, built: Built, model: tf.keras.Model, config: Config, jit_compile: bool,
                 cache_features: bool = True):
        self.built = built
        self.clients = [PlainClient(model, config.learning_rate, s.phases, jit_compile,
                                    cache_features)
                        for s in built.sub_rounds]
        self.trainable: list[np.ndarray] = []
        self.non_trainable: list[tf.Tensor] = []
        self.federated: list[int] = []
        self.personal: list[list[np.ndarray]] = []
        self.bytes = {"down": 0, "up": 0}

    def reset(self, trainable, non_trainable, num_clients: int) -> None:
        """Starts from the given whole-model weights; personal heads = the initial head. Only
        the federated variables (those some sub-round uploads) count as broadcast, as in TFF."""
        self.trainable = [np.array(w) for w in trainable]
        self.non_trainable = [tf.constant(w) for w in non_trainable]
        self.federated = sorted({k for s in self.built.sub_rounds for k in s.upload})
        self.personal = [[self.trainable[k].copy() for k in self.built.personal]
                         for _ in range(num_clients)]

    @property
    def traces(self) -> int:
        return sum(c.traces for c in self.clients)

    def round(self, datasets: Sequence[tf.data.Dataset]) -> None:
        """One `next`: every sub-round over all clients; records bytes per client."""
        down = up = 0
        for sub, client in zip(self.built.sub_rounds, self.clients):
            broadcast = [tf.constant(w) for w in self.trainable]
            down += sum(self.trainable[k].nbytes for k in self.federated)
            sums = {k: np.zeros_like(self.trainable[k]) for k in sub.upload}
            total = 0.0
            for i, dataset in enumerate(datasets):
                start = broadcast
                if self.built.personal:
                    start = list(broadcast)
                    for k, value in zip(self.built.personal, self.personal[i]):
                        start[k] = tf.constant(value)
                values, loss_sum, num_correct, num_examples = client.run(
                    start, self.non_trainable, dataset)
                n = float(num_examples)
                deltas = {k: values[k].numpy() - self.trainable[k] for k in sub.upload}
                metrics = [np.float32(loss_sum), np.float32(num_correct), np.float32(n)]
                if i == 0:
                    up += sum(d.nbytes for d in deltas.values()) + sum(m.nbytes for m in metrics)
                for k, d in deltas.items():
                    sums[k] += n * d
                total += n
                if self.built.personal:
                    self.personal[i] = [values[k].numpy() for k in self.built.personal]
            for k in sub.upload:
                self.trainable[k] = self.trainable[k] + (sums[k] / total).astype(
                    self.trainable[k].dtype)
        self.bytes = {"down": down, "up": up}
