"""A switch round: one round kind that runs one of two kinds, chosen in-graph by the round
number t, so a schedule that is not periodic is still one `tff.Computation`.

RoLoRA→FFA (`rolora.md` §1.3 (ii)) alternates RoLoRA's B and A rounds until round `switch`,
then runs B rounds only. As a `SwitchRoundSpec((b_round, a_round), switch)` every communication
round t (0-based) is

    kind(t) = a_round  if t < switch and t is odd,  else b_round

- the client work's state is t itself (int32 at SERVER, broadcast, +1 per round); each client
  runs the chosen kind's phases (`tf.cond` between the kinds' phased loops on one Keras model);
- a client uploads the chosen kind's deltas flattened into one float32 vector of length
  L = max_k |uploaded_k| (zero-padded): for RoLoRA's square adapters L = |A| + |extra| = |B| +
  |extra|, the bytes of one RoLoRA round, so the switch costs no extra upload;
- the aggregator (any `tff.aggregators` factory) aggregates that vector; the server step
  (`SwitchStep`) unpacks the chosen kind's deltas and applies the server optimizer to them, with
  one optimizer state per kind (as RoLoRA's keyed states);
- the finalizer reports `round_kind`, the kind that ran.

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
from tffl.engine import communication
from tffl.engine import rounds as engine
from tffl.engine import server_steps


@dataclasses.dataclass(frozen=True)
class SwitchRoundSpec:
    """One round kind running `kinds[1]` at rounds t < `switch` with t odd, else `kinds[0]`.

    Both kinds upload deltas ("delta") and use the server optimizer ("optimizer")."""

    name: str
    kinds: tuple[engine.RoundSpec, engine.RoundSpec]
    switch: int

    @property
    def phases(self) -> tuple[client_training.Phase, ...]:
        """Every phase of either kind (what the round may train)."""
        return tuple(p for kind in self.kinds for p in kind.phases)


def chosen_kind(t, switch: int):
    """1 (the second kind) at rounds t < `switch` with t odd, else 0 (int32; t an int32)."""
    t = tf.convert_to_tensor(t, tf.int32)
    return tf.cast(tf.logical_and(tf.less(t, switch), tf.equal(tf.math.floormod(t, 2), 1)),
                   tf.int32)


def _check(round_spec: SwitchRoundSpec, client: engine.ClientConfig) -> None:
    if client.hook is not None:
        raise ValueError(f"round {round_spec.name!r}: a switch round takes no client hook")
    for kind in round_spec.kinds:
        if kind.upload != "delta" or kind.server_step != "optimizer":
            raise ValueError(f"round {round_spec.name!r}: kind {kind.name!r} must upload "
                             "\"delta\" and use the \"optimizer\" server step")
    if round_spec.switch < 0:
        raise ValueError(f"switch={round_spec.switch} must be >= 0")


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


def build_switch_client(model: engine.FederatedModel, round_spec: SwitchRoundSpec,
                        client: engine.ClientConfig, uploaded, length: int) -> tff.Computation:
    """`(w, data, t) -> (ClientResult(float32[L], n_i), metric sums, [])`: the chosen kind's
    phases on one Keras model, its deltas packed into the upload vector."""
    layout, switch = model.layout, round_spec.switch

    @tff.tensorflow.computation(layout.global_type(), model.data_type(), np.int32)
    def client_update(weights, dataset, t):
        with client_training.placed(model.client_device):
            keras_model = client_training.build_model(model.keras_model_fn, model.input_spec,
                                                      zero_init=True)
            full = layout.assemble(weights, model.frozen.restore())
            loops = [client_training.build_phased_loop(
                keras_model, model.loss_fn(), client.optimizer, kind.phases,
                device=model.client_device, weight_decay=client.weight_decay,
                jit_compile=client.jit_compile) for kind in round_spec.kinds]
            second = tf.cast(chosen_kind(t, switch), tf.bool)
            out = tf.cond(second, lambda: loops[1](full, dataset),
                          lambda: loops[0](full, dataset))
        trained, old = list(out["trainable"]), full.trainable
        packed = [_packed([trained[k] - old[k] for k in up], length) for up in uploaded]
        update = tf.where(second, packed[1], packed[0])
        result = tff.learning.templates.ClientResult(update=update,
                                                     update_weight=out["num_examples"])
        metrics = collections.OrderedDict(loss_sum=out["loss_sum"],
                                          num_correct=out["num_correct"],
                                          num_examples=out["num_examples"])
        return result, metrics, []

    return client_update


class SwitchStep:
    """The server step of a switch round: `apply(state, w, v̄, round_num)` unpacks the chosen
    kind's mean deltas Δ̄ from v̄ and takes the server optimizer's step on that kind's variables
    (gradient −Δ̄), with the optimizer state of that kind (`state`: one per kind)."""

    def __init__(self, optimizer, model, uploaded, switch: int, update_type: tff.Type):
        weights_type = model.layout.global_type()
        positions = [tuple(model.layout.global_index(k) for k in up) for up in uploaded]

        @tff.tensorflow.computation
        def initialize():
            return tuple(optimizer.initialize(server_steps._specs(weights_type, p))
                         for p in positions)

        def branch(k, state, weights, update):
            trainable = list(weights.trainable)
            states = list(state)
            states[k] = server_steps._optimizer_apply(
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


def _round_kind_measure(round_spec: SwitchRoundSpec) -> tff.Computation:
    names = [kind.name for kind in round_spec.kinds]

    @tff.tensorflow.computation(np.int32)
    def measure(round_num):
        kind = chosen_kind(round_num - 1, round_spec.switch)
        return collections.OrderedDict(round_kind=tf.gather(tf.constant(names), kind))

    return measure


def build_switch_round(model: engine.FederatedModel, round_spec: SwitchRoundSpec,
                       client: engine.ClientConfig, aggregator=None,
                       server_optimizer=None) -> engine.RoundPieces:
    """The pieces of a switch round (see the module docstring); `aggregator` and
    `server_optimizer` as `engine.build_round`'s."""
    _check(round_spec, client)
    factory, _ = engine.weighted_factory(aggregator or tff.aggregators.MeanFactory())
    server_optimizer = server_optimizer or tff.learning.optimizers.build_sgdm(1.0)
    uploaded = [engine._uploaded(model, kind) for kind in round_spec.kinds]
    length = max(sum(_sizes(model, up)) for up in uploaded)
    client_update = build_switch_client(model, round_spec, client, uploaded, length)
    result_type = client_update.type_signature.result[0]
    aggregation = factory.create(result_type.update, result_type.update_weight)
    step = SwitchStep(server_optimizer, model, uploaded, round_spec.switch,
                      aggregation.next.type_signature.result.result.member)
    # Down: the weights and the round number t.
    traffic = communication.declared_traffic(
        tff.StructType([model.layout.global_type(), tff.TensorType(np.int32)]), client_update)
    return engine.RoundPieces(round_spec.name, client_update, aggregation, step, traffic,
                              result_type, round_counter=True,
                              round_measure=_round_kind_measure(round_spec))


def build_round(model: engine.FederatedModel, round_spec, client: engine.ClientConfig,
                aggregator=None, server_optimizer=None) -> engine.RoundPieces:
    """The pieces of a round of either kind: `engine.build_round` for an `engine.RoundSpec`,
    `build_switch_round` for a `SwitchRoundSpec`."""
    build = (build_switch_round if isinstance(round_spec, SwitchRoundSpec)
             else engine.build_round)
    return build(model, round_spec, client, aggregator, server_optimizer)
