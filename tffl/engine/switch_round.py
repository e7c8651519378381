"""A switch round: one round kind that runs one of two kinds, chosen in-graph by the round
number t, so a schedule that is not periodic is still one `tff.Computation`.

RoLoRA→FFA (`rolora.md` §1.3 (ii)) alternates RoLoRA's B and A rounds until round `switch`,
then runs B rounds only. As a `SwitchRoundSpec((b_round, a_round), switch)` every communication
round t (0-based) is

    kind(t) = a_round  if t < switch and t is odd,  else b_round

- the server broadcasts t (the finalizer's `round_num`, a round input) with the weights; each
  client runs the chosen kind's phases (`tf.cond` between the kinds' phased loops on one Keras
  model), in the engine's one client computation (`tffl.engine.rounds.build_client_computation`);
- a client uploads the chosen kind's deltas flattened into one float32 vector of length
  L = max_k |uploaded_k| (zero-padded): for RoLoRA's square adapters L = |A| + |extra| = |B| +
  |extra|, the bytes of one RoLoRA round, so the switch costs no extra upload;
- the aggregator (any `tff.aggregators` factory) aggregates that vector; the server step
  (`SwitchStep`) unpacks the chosen kind's deltas and applies the server optimizer to them, with
  one optimizer state per kind (as RoLoRA's keyed states);
- the finalizer reports `round_kind`, the kind that ran.

`SwitchRoundSpec` follows the round-kind protocol of `tffl.engine.rounds.RoundSpec`, so
`tffl.engine.rounds.build_round` builds its pieces.

>>> kinds = ("b_round", "a_round")
>>> [kinds[int(chosen_kind(t, switch=3))] for t in range(6)]
['b_round', 'a_round', 'b_round', 'b_round', 'b_round', 'b_round']
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import client_training
from tffl.engine import rounds
from tffl.engine import server_steps


@dataclasses.dataclass(frozen=True)
class SwitchRoundSpec:
    """One round kind running `kinds[1]` at rounds t < `switch` with t odd, else `kinds[0]`.

    Both kinds upload deltas ("delta") and use the server optimizer ("optimizer")."""

    name: str
    kinds: tuple[rounds.RoundSpec, rounds.RoundSpec]
    switch: int

    # The round-kind protocol (`tffl.engine.rounds.RoundSpec`).

    upload = "delta"
    round_inputs = ("round_num",)

    @property
    def phases(self) -> tuple[client_training.Phase, ...]:
        """Every phase of either kind (what the round may train)."""
        return tuple(p for kind in self.kinds for p in kind.phases)

    @property
    def alternatives(self) -> tuple[rounds.RoundSpec, rounds.RoundSpec]:
        return self.kinds

    def check(self, client) -> None:
        """ValueError unless both kinds upload deltas to the server optimizer, the switch is
        >= 0, and no client hook is given."""
        if client.hook is not None:
            raise ValueError(f"round {self.name!r}: a switch round takes no client hook")
        for kind in self.kinds:
            if kind.upload != "delta" or kind.server_step != "optimizer":
                raise ValueError(f"round {self.name!r}: kind {kind.name!r} must upload "
                                 "\"delta\" and use the \"optimizer\" server step")
        if self.switch < 0:
            raise ValueError(f"switch={self.switch} must be >= 0")

    def train(self, loops, weights, dataset, values):
        """The chosen kind's phased loop (`tf.cond` on t)."""
        second = tf.cast(chosen_kind(values["round_num"], self.switch), tf.bool)
        return tf.cond(second, lambda: loops[1](weights, dataset),
                       lambda: loops[0](weights, dataset))

    def update(self, model, trained, old, values):
        """The chosen kind's deltas, packed into one vector of the longer kind's length."""
        uploaded = self._uploaded(model)
        length = max(sum(_sizes(model, up)) for up in uploaded)
        packed = [_packed([trained[k] - old[k] for k in up], length) for up in uploaded]
        second = tf.cast(chosen_kind(values["round_num"], self.switch), tf.bool)
        return tf.where(second, packed[1], packed[0])

    def build_server_step(self, model, optimizer, update_type):
        return SwitchStep(optimizer, model, self._uploaded(model), self.switch, update_type)

    def measure(self, model):
        """`(w, aggregate, round_num) -> {round_kind}`: the kind that ran (t = round_num − 1)."""
        del model
        names = [kind.name for kind in self.kinds]

        def round_kind(weights, aggregate, round_num):
            del weights, aggregate
            kind = chosen_kind(round_num - 1, self.switch)
            return collections.OrderedDict(round_kind=tf.gather(tf.constant(names), kind))

        return round_kind

    def _uploaded(self, model) -> list[tuple[int, ...]]:
        return [rounds.uploaded_positions(model, kind) for kind in self.kinds]


def chosen_kind(t, switch: int):
    """1 (the second kind) at rounds t < `switch` with t odd, else 0 (int32; t an int32)."""
    t = tf.convert_to_tensor(t, tf.int32)
    return tf.cast(tf.logical_and(tf.less(t, switch), tf.equal(tf.math.floormod(t, 2), 1)),
                   tf.int32)


def _sizes(model, uploaded) -> list[int]:
    return [int(np.prod(model.spec.trainable[k].shape)) for k in uploaded]


def _packed(deltas, length: int):
    flat = tf.concat([tf.reshape(tf.cast(d, tf.float32), [-1]) for d in deltas], 0)
    return tf.pad(flat, [[0, length - int(flat.shape[0])]])


def _unpacked(vector, model, uploaded):
    values, offset = [], 0
    for k, size in zip(uploaded, _sizes(model, uploaded)):
        info = model.spec.trainable[k]
        values.append(tf.cast(tf.reshape(vector[offset:offset + size], info.shape), info.dtype))
        offset += size
    return values


class SwitchStep:
    """The server step of a switch round: `apply(state, w, v̄, round_num)` unpacks the chosen
    kind's mean deltas Δ̄ from v̄ and takes the server optimizer's step on that kind's variables
    (gradient −Δ̄), with the optimizer state of that kind (`state`: one per kind)."""

    def __init__(self, optimizer, model, uploaded, switch: int, update_type: tff.Type):
        weights_type = model.layout.global_type()
        positions = [tuple(model.layout.global_index(k) for k in up) for up in uploaded]

        @tff.tensorflow.computation
        def initialize():
            return tuple(optimizer.initialize(server_steps.tensor_specs(weights_type, p))
                         for p in positions)

        def branch(k, state, weights, update):
            trainable = list(weights.trainable)
            states = list(state)
            states[k] = server_steps.optimizer_apply(
                optimizer, states[k], trainable, positions[k],
                _unpacked(update, model, uploaded[k]))
            return tuple(states), trainable

        @tff.tensorflow.computation(initialize.type_signature.result, weights_type, update_type,
                                    np.int32)
        def apply(state, weights, update, round_num):
            second = tf.cast(chosen_kind(round_num - 1, switch), tf.bool)
            state, trainable = tf.cond(second, lambda: branch(1, state, weights, update),
                                       lambda: branch(0, state, weights, update))
            return state, tff.learning.models.ModelWeights(
                trainable=trainable, non_trainable=list(weights.non_trainable))

        self.initialize, self.apply = initialize, apply
