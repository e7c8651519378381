"""Server steps: what the finalizer of a communication round does with the aggregated upload.

Each step is a pair of TensorFlow computations on the federated `ModelWeights` w (the
`tffl.engine.frozen.Layout`'s global weights; `positions` index `w.trainable`):

- `initialize() -> state`
- `apply(state, w, aggregate, round_num) -> (state, w)`, `round_num` the number of communication
  rounds done once this one is (int32).

| step            | aggregate                                   | w after the step                      |
|-----------------|---------------------------------------------|----------------------------------------|
| `OptimizerStep` | Δ̄ (mean delta) of `w.trainable[positions]` | server optimizer step with gradient −Δ̄ |
| `SvdStep`       | Σ p_i A_iB_i per adapter, then other deltas | A,B ← √-split rank-r SVD of Σ p_i A_iB_i |
| `MergeStep`     | Σ p_i A_iB_i per adapter, then other deltas | W0 += scale·Σ p_i A_iB_i; A ← fresh, B ← 0 |

With the default server optimizer (SGD, η_s = 1) `OptimizerStep` gives w + Δ̄ = mean_i w_i, the
plain FedAvg mean. (`tffl.engine.rounds` wraps the steps into `tff.learning.templates.FinalizerProcess`es.)

Example:

>>> vector = tff.TensorType(np.float32, [2])
>>> weights_type = tff.to_type(tff.learning.models.ModelWeights(trainable=[vector],
...                                                             non_trainable=[]))
>>> step = OptimizerStep(tff.learning.optimizers.build_sgdm(1.0), weights_type, positions=(0,),
...                      update_type=tff.to_type([vector]))
>>> w = tff.learning.models.ModelWeights(trainable=[np.ones(2, np.float32)], non_trainable=[])
>>> with runtime.local_runtime():                 # SGD, η_s = 1: w + Δ̄
...     state, w = step.apply(step.initialize(), w, [np.array([0.5, -1.0], np.float32)], 1)
>>> np.asarray(w[0][0]).tolist()
[1.5, 0.0]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def tensor_specs(weights_type, positions):
    """The `tf.TensorSpec`s of `weights_type.trainable[positions]` (a server optimizer's state)."""
    return [tf.TensorSpec(weights_type.trainable[k].shape, weights_type.trainable[k].dtype)
            for k in positions]


def optimizer_apply(optimizer, state, trainable: list, positions, deltas):
    """`optimizer.next` on `trainable[positions]` with gradient −Δ (in place on the list)."""
    if not positions:
        return state
    weights = [trainable[k] for k in positions]
    state, new = optimizer.next(state, weights, [-d for d in deltas])
    for k, value in zip(positions, new):
        trainable[k] = value
    return state


def _build_step(optimizer, weights_type, positions: Sequence[int], update_type, body):
    """`(initialize, apply)` of a step: `apply` runs `body(trainable, non_trainable, update,
    round_num)` (which edits the lists in place and returns the deltas of `positions`), then the
    server optimizer on `positions` with those deltas."""
    positions = tuple(positions)

    @tff.tensorflow.computation
    def initialize():
        return optimizer.initialize(tensor_specs(weights_type, positions))

    @tff.tensorflow.computation(initialize.type_signature.result, weights_type, update_type,
                                np.int32)
    def apply(state, weights, update, round_num):
        trainable, non_trainable = list(weights.trainable), list(weights.non_trainable)
        deltas = body(trainable, non_trainable, update, round_num)
        state = optimizer_apply(optimizer, state, trainable, positions, deltas)
        return state, tff.learning.models.ModelWeights(trainable=trainable,
                                                       non_trainable=non_trainable)

    return initialize, apply


class OptimizerStep:
    """w.trainable[positions] ← server optimizer step with gradient −Δ̄ (`update` = the list of
    Δ̄ in `positions` order)."""

    def __init__(self, optimizer: tff.learning.optimizers.Optimizer, weights_type: tff.Type,
                 positions: Sequence[int], update_type: tff.Type):
        def deltas(trainable, non_trainable, update, round_num):
            del trainable, non_trainable, round_num
            return list(update)

        self.initialize, self.apply = _build_step(optimizer, weights_type, positions,
                                                  update_type, deltas)


class SvdStep:
    """FlexLoRA (Bai et al. 2024): for each pair (A at `pairs[j][0]`, B at `pairs[j][1]`, rank r)
    the aggregate is the clients' mean product P = Σ_i p_i A_iB_i (the stacking of their uploaded
    factors, `tffl.engine.factor_aggregation.stacking_aggregation`; Σ p_i = 1, so P also equals
    A·B + Σ_i p_i(A_iB_i − A·B)); P ≈ U_r S_r V_rᵀ (rank-r truncated SVD), A ← U_r S_r^{1/2},
    B ← S_r^{1/2} V_rᵀ. The `others` positions take a server optimizer step on their deltas.
    `update` = ([P per pair, in pair order], [deltas in `others` order])."""

    def __init__(self, optimizer, weights_type, pairs: Sequence[tuple[int, int]],
                 others: Sequence[int], update_type):
        pairs = tuple(pairs)

        def split_svd(trainable, non_trainable, update, round_num):
            del non_trainable, round_num
            products, deltas = update
            for (a, b), product in zip(pairs, products):
                rank = weights_type.trainable[a].shape[1]
                s, u, v = tf.linalg.svd(product)
                root = tf.sqrt(s[:rank])
                trainable[a] = u[:, :rank] * root[tf.newaxis, :]
                trainable[b] = root[:, tf.newaxis] * tf.transpose(v[:, :rank])
            return list(deltas)

        self.initialize, self.apply = _build_step(optimizer, weights_type, others, update_type,
                                                  split_svd)


def flora_a_init(shape: tuple[int, int], seed: int, round_num, pair: int, num_pairs: int
                 ) -> tf.Tensor:
    """FLoRA's fresh A after communication round t = `round_num` (a scalar tensor ≥ 1):

        A ~ U(−1/√d_in, 1/√d_in),  `tf.random.stateless_uniform(shape, [seed, t·L + k])`

    with k = `pair` (position of the adapter among the L = `num_pairs` linked adapters). Drawn by
    the server, the same for all clients; PEFT's default LoRA-A distribution. (Round 0 uses the
    model's own A.)
    """
    bound = 1.0 / np.sqrt(shape[0])
    stream = tf.cast(round_num, tf.int64) * num_pairs + pair
    return tf.random.stateless_uniform(
        shape, tf.stack([tf.constant(seed, tf.int64), stream]), minval=-bound, maxval=bound)


class MergeStep:
    """FLoRA (Wang et al. 2024): for each linked adapter j (A at `links[j].a`, B at `links[j].b`,
    its base kernel W0 at `links[j].base` of `w.trainable` or `w.non_trainable`),
    W0 ← W0 + scale·reshape(Σ_i p_i A_iB_i, W0.shape), then A ← `flora_a_init(seed, t)`, B ← 0;
    the `others` positions take a server optimizer step. `update` = (products, other deltas)."""

    def __init__(self, optimizer, weights_type, links, others: Sequence[int], seed: int,
                 update_type):
        def merge(trainable, non_trainable, update, round_num):
            products, deltas = update
            for k, (link, product) in enumerate(zip(links, products)):
                base = trainable if link.base_trainable else non_trainable
                kernel = base[link.base]
                base[link.base] = kernel + tf.cast(
                    link.scale * tf.reshape(product, tf.shape(kernel)), kernel.dtype)
                a = trainable[link.a]
                trainable[link.a] = tf.cast(
                    flora_a_init(tuple(a.shape), seed, round_num, k, len(links)), a.dtype)
                trainable[link.b] = tf.zeros_like(trainable[link.b])
            return list(deltas)

        self.initialize, self.apply = _build_step(optimizer, weights_type, others, update_type,
                                                  merge)
