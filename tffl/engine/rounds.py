"""Round kinds on a Keras model: the pieces of one kind of communication round, as the one
composer (`tffl.engine.composition`) takes them (`RoundPieces`).

A communication round is TFF's four typed pieces over the federated weights w of a
`FederatedModel` (its `tffl.engine.frozen.Layout`; the frozen base never travels):

1. distributor: TFF's `build_broadcast_process` of w (the composer's), with the round's inputs
   (`RoundPieces.round_inputs`: |I|, or the round number t) broadcast beside it;
2. client work: the one client computation (`build_client_computation`), a
   `tff.tensorflow.computation` per client — build the Keras model, restore the base weights
   from their checkpoint file, assemble w (+ the client's personal state), run the round's phases
   with `tffl.engine.client_training.build_phased_loop` (a `tff.learning.optimizers` client
   optimizer), and upload `ClientResult(update, update_weight = n_i)`; its train metrics (loss,
   accuracy, examples) go through `tff.learning.metrics.sum_then_finalize`;
3. aggregator: any `tff.aggregators` factory (weighted; unweighted ones via
   `tff.aggregators.as_weighted_aggregator`), or, for uploaded factors (FLoRA, FlexLoRA), the
   stacking sum Σ p_i A_iB_i (`tffl.engine.factor_aggregation`);
4. finalizer: a `tffl.engine.server_steps` step (a `tff.learning.optimizers` server optimizer by
   default; FlexLoRA's SVD; FLoRA's merge), plus the round's measurements if it has any
   (`RoundPieces.measure`, e.g. `with_averaging_error`).

A round kind is described by a `RoundSpec` (its phases, upload and server step) or by a
`tffl.engine.switch_round.SwitchRoundSpec` (one of two kinds, chosen in-graph by t); both
follow the same protocol (`alternatives`, `round_inputs`, `check`, `train`, `update`,
`build_server_step`, `measure`), so `build_client_computation` and `build_round` serve both.

Example:

>>> from tffl.engine.federated_model import ModelSource, build_federated_model
>>> from tffl.engine.client_hooks import ClientConfig
>>> model = build_federated_model(ModelSource(model_fn, input_spec),
...                               federated=spec.indices(["lora_a", "lora_b", "head"]))
>>> b_round = RoundSpec("b_round", (client_training.Phase(spec.indices(["lora_b", "head"])),))
>>> pieces = build_round(model, b_round, ClientConfig(optimizer=client_training.as_optimizer(0.1)))
>>> pieces.traffic.down, pieces.traffic.up      # 4·(16 + 16 + 27) down; 4·(16 + 27) + 16 up
(236, 188)
>>> from tffl.engine import process as process_lib
>>> from tffl.engine import schedules       # FFA-LoRA: the B round every time
>>> ffa = process_lib.build_process("ffa_lora", [pieces], process_lib.Federated(
...     model.initial_weights(), model.data_type()), schedules.constant("b_round"))
>>> list(ffa.rounds), ffa.personal is None      # a `LearningProcess` of one round kind
(['b_round'], True)
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow_federated as tff

from tffl.engine import client_hooks
from tffl.engine import client_training
from tffl.engine import communication
from tffl.engine import factor_aggregation
from tffl.engine import federated_model
from tffl.engine import model_spec
from tffl.engine import server_steps

# What one client sends besides its update: the three float32 metric sums and the float32 weight.
METRIC_UPLOAD_BYTES = 3 * 4
WEIGHT_UPLOAD_BYTES = 4
UPLOADS = ("delta", "factors")
SERVER_STEPS = ("optimizer", "svd", "merge")


@dataclasses.dataclass(frozen=True)
class RoundSpec:
    """One kind of communication round.

    Attributes:
      name: e.g. "b_round".
      phases: the clients' local phases (`Phase.train_indices` index `spec.trainable`).
      upload: what a client sends: "delta" (Δ_i of `uploaded`) or "factors" ((A_i, B_i) for
        each of `pairs`, then Δ_i of the rest of `uploaded`; aggregated by
        `factor_aggregation.stacking_aggregation` into Σ p_i A_iB_i per adapter).
      server_step: what the server does with the aggregate (`tffl.engine.server_steps`): "optimizer"
        (`OptimizerStep` on the mean deltas; needs "delta"), "svd" (FlexLoRA's `SvdStep` on
        Σ p_i A_iB_i; needs "factors") or "merge" (FLoRA's `MergeStep`; needs "factors").
      uploaded: positions in `spec.trainable` sent up (default: the phases' trained federated
        variables).
      pairs: (A, B) positions in `spec.trainable` for "factors".
      links: FLoRA's `model_spec.LinkInfo`s (same order as `pairs`); seed: its A seed.
    """

    name: str
    phases: tuple[client_training.Phase, ...]
    upload: str = "delta"
    uploaded: tuple[int, ...] | None = None
    server_step: str = "optimizer"
    pairs: tuple[tuple[int, int], ...] = ()
    links: tuple[Any, ...] = ()
    seed: int = 0

    # The round-kind protocol of `build_client_computation` and `build_round`.

    round_inputs = ()   # values this kind needs broadcast beside w (`client_hooks.ROUND_INPUTS`)

    @property
    def alternatives(self) -> tuple[RoundSpec, ...]:
        """The kinds whose phases a client may run (one: this)."""
        return (self,)

    def check(self, client: client_hooks.ClientConfig) -> None:
        """ValueError naming the field unless the upload and the server step fit together."""
        del client
        upload, step = self.upload, self.server_step
        if upload not in UPLOADS:
            raise ValueError(f"upload={upload!r} must be one of {UPLOADS}")
        if step not in SERVER_STEPS:
            raise ValueError(f"server_step={step!r} must be one of {SERVER_STEPS}")
        if (upload == "factors") != (step in ("svd", "merge")):
            raise ValueError(f"round {self.name!r}: server_step={step!r} does not take "
                             f"upload={upload!r} (\"svd\" and \"merge\" take \"factors\", "
                             "\"optimizer\" takes \"delta\")")
        if upload == "factors" and not self.pairs:
            raise ValueError(f"round {self.name!r}: upload=\"factors\" needs pairs")

    def train(self, loops, weights, dataset, values):
        """The client's local training: the one phased loop."""
        del values
        return loops[0](weights, dataset)

    def update(self, model: federated_model.FederatedModel, trained, old, values):
        """What a client uploads: the deltas of `uploaded`, or ([(A_i, B_i)], other deltas)."""
        del values
        deltas = [trained[k] - old[k] for k in _singles(model, self)]
        if self.upload == "factors":
            return [(trained[a], trained[b]) for a, b in self.pairs], deltas
        return deltas

    def build_server_step(self, model: federated_model.FederatedModel, optimizer, update_type):
        """The finalizer's step (`tffl.engine.server_steps`) on the aggregate of `update_type`."""
        return _server_step(model, self, update_type, optimizer)

    def measure(self, model: federated_model.FederatedModel):
        """The round's measurement, `(w, aggregate, round_num) -> OrderedDict` (TF; none)."""
        del model


def uploaded_positions(model: federated_model.FederatedModel, round_spec: RoundSpec
                       ) -> tuple[int, ...]:
    """Positions in `spec.trainable` a client of `round_spec` sends up (default: the trained
    federated variables)."""
    if round_spec.uploaded is not None:
        return tuple(round_spec.uploaded)
    trained = {k for phase in round_spec.phases for k in phase.train_indices}
    return tuple(k for k in model.layout.trainable if k in trained)


def _singles(model: federated_model.FederatedModel, round_spec: RoundSpec) -> list[int]:
    """Positions in `spec.trainable` uploaded as deltas (all of `uploaded` but the factors)."""
    paired = ({k for pair in round_spec.pairs for k in pair} if round_spec.upload == "factors"
              else set())
    return [k for k in uploaded_positions(model, round_spec) if k not in paired]


def _inputs(round_spec, hook) -> tuple[str, ...]:
    """The round inputs of a kind and its client hook (`client_hooks.ROUND_INPUTS`)."""
    return tuple(dict.fromkeys(client_hooks.checked_inputs(round_spec.round_inputs)
                               + client_hooks.round_inputs(hook)))


def build_client_computation(model: federated_model.FederatedModel, round_spec,
                             client: client_hooks.ClientConfig) -> tff.Computation:
    """The one client computation of a round kind on a Keras model:

        <w, data[, personal][, round values]> -> (ClientResult, metric sums, personal')

    one struct argument (its members present as the model and kind need them): the federated
    weights, the client's dataset, its personal state (`federated_model.personal_spec`; absent
    when that is empty) and the round's inputs (`OrderedDict(name=value)`, absent when the kind
    and its hook take none). The client builds the Keras model, assembles w with the frozen base
    and its personal state, runs `round_spec.train` (its phased loops, prepared by the hook),
    and uploads `round_spec.update` weighted by its examples n_i."""
    layout, hook = model.layout, client.hook
    round_spec.check(client)
    personal = federated_model.personal_spec(model, hook)
    inputs = _inputs(round_spec, hook)
    own_count = len(layout.personal)

    def work(weights, dataset, personal_values, values):
        with client_training.placed(model.client_device):
            keras_model = model_spec.build_model(model.keras_model_fn, model.input_spec,
                                                 zero_init=True)
            own, extra = personal_values[:own_count], personal_values[own_count:]
            full = layout.assemble(weights, model.frozen.restore(), own if own_count else None)
            phases = [kind.phases for kind in round_spec.alternatives]
            features_model, context = None, None
            if hook is not None:
                prepared, features_model, context = hook.prepare(keras_model, extra, dataset,
                                                                 phases[0])
                phases = [prepared]
            loops = [client_training.build_phased_loop(
                keras_model, model.loss_fn(), client.optimizer, p, features_model,
                device=model.client_device, weight_decay=client.weight_decay,
                jit_compile=client.jit_compile) for p in phases]
            start = full if hook is None else hook.start(full, context)
            out = round_spec.train(loops, start, dataset, values)
        trained, extra_out = list(out["trainable"]), []
        if hook is not None:
            trained, extra_out = hook.finish(
                trained, context, **{n: values[n] for n in client_hooks.round_inputs(hook)})
        result = tff.learning.templates.ClientResult(
            update=round_spec.update(model, trained, full.trainable, values),
            update_weight=out["num_examples"])
        metrics = collections.OrderedDict(loss_sum=out["loss_sum"],
                                          num_correct=out["num_correct"],
                                          num_examples=out["num_examples"])
        return result, metrics, [trained[k] for k in layout.personal] + list(extra_out)

    members = [layout.global_type(), model.data_type()]
    if personal:
        members.append(personal.type)
    if inputs:
        members.append(client_hooks.round_inputs_type(inputs))

    @tff.tensorflow.computation(tff.StructType(members))
    def client_update(args):
        args = list(args)
        personal_values = list(args[2]) if personal else []
        values = args[-1] if inputs else {}
        return work(args[0], args[1], personal_values, values)

    return client_update


def weighted_factory(factory) -> tuple[tff.aggregators.WeightedAggregationFactory, bool]:
    """(`factory` as a weighted factory, whether it weighs): unweighted ones through
    `tff.aggregators.as_weighted_aggregator`.

    Raises:
      TypeError: `factory` is not a `tff.aggregators` factory."""
    if isinstance(factory, tff.aggregators.WeightedAggregationFactory):
        return factory, True
    if isinstance(factory, tff.aggregators.UnweightedAggregationFactory):
        return tff.aggregators.as_weighted_aggregator(factory), False
    raise TypeError("aggregator must be a tff.aggregators Weighted- or "
                    f"UnweightedAggregationFactory, got {type(factory).__name__}")


def _server_step(model, round_spec, update_type, optimizer):
    layout = model.layout
    weights_type = layout.global_type()
    others = [layout.global_index(k) for k in _singles(model, round_spec)]
    if round_spec.server_step == "svd":
        pairs = [(layout.global_index(a), layout.global_index(b)) for a, b in round_spec.pairs]
        return server_steps.SvdStep(optimizer, weights_type, pairs, others, update_type)
    if round_spec.server_step == "merge":
        links = []
        for link in round_spec.links:
            base = (layout.global_index(link.base_index) if link.base_trainable
                    else layout.non_trainable.index(link.base_index))
            links.append(_GlobalLink(layout.global_index(link.a_index),
                                     layout.global_index(link.b_index), base,
                                     link.base_trainable, link.scale))
        return server_steps.MergeStep(optimizer, weights_type, links, others, round_spec.seed,
                                      update_type)
    return server_steps.OptimizerStep(optimizer, weights_type, others, update_type)


@dataclasses.dataclass(frozen=True)
class _GlobalLink:
    a: int
    b: int
    base: int
    base_trainable: bool
    scale: float


@dataclasses.dataclass(frozen=True)
class SecondExchange:
    """A round kind's second exchange with the same clients (linear FLUTE's): after the first
    aggregation, the kind's second distributor sends r = `distributor`(aggregate) (a TF
    computation) to the round's clients, and each runs `client_update(w, r, data, personal) ->
    personal'` (w: what the first exchange sent it). Nothing goes up; the round needs personal
    state."""

    distributor: tff.Computation
    client_update: tff.Computation


@dataclasses.dataclass(frozen=True)
class RoundPieces:
    """The pieces of one round kind, as the composer (`tffl.engine.composition`) takes them.

    Attributes:
      name: the round kind.
      client_update: `(w, data[, personal][, round values]) -> (ClientResult, metric sums,
        personal')`, a TF computation (one struct argument, or those arguments).
      aggregator: the `tff.templates.AggregationProcess` of the updates (weighted: with n_i;
        unweighted: without).
      step: the server step (`initialize`, `apply(state, w, aggregate, round_num) -> (state, w')`,
        `tffl.engine.server_steps`).
      measure: `(w, aggregate, round_num) -> measurements` reported as the finalizer's metrics,
        or None.
      round_inputs: values broadcast beside w (`client_hooks.ROUND_INPUTS`), the client
        computation's last argument.
      second_exchange: a `SecondExchange`, or None.
      finalize_metrics: Σ_i (metric sums of client i) -> the round's `client_work/train` (TF);
        None: a Keras round's {loss, accuracy, num_examples}.
    """

    name: str
    client_update: tff.Computation
    aggregator: tff.templates.AggregationProcess
    step: Any
    measure: tff.Computation | None = None
    round_inputs: tuple[str, ...] = ()
    second_exchange: SecondExchange | None = None
    finalize_metrics: Any = None

    @property
    def upload_type(self) -> tff.Type:
        """The client's `ClientResult` type."""
        return self.client_update.type_signature.result[0]

    @property
    def traffic(self) -> communication.RoundTraffic:
        """The declared bytes per client (what `Process.traffic` reports for rounds TFF's forms
        cannot hold), from the types that cross: down w, the round inputs and the second
        exchange's broadcast; up the update (and its weight, if the aggregator weighs), the
        metric sums and |I|'s one."""
        weights_type = self.step.apply.type_signature.parameter[1]
        extra = client_hooks.round_input_traffic(self.round_inputs)
        if self.second_exchange is not None:
            extra = communication.RoundTraffic(
                down=extra.down + communication.type_bytes(
                    self.second_exchange.distributor.type_signature.result),
                up=extra.up)
        return communication.declared_traffic(weights_type, self.client_update, extra,
                                              weighted=self.aggregator.is_weighted)


def build_round(model: federated_model.FederatedModel, round_spec,
                client: client_hooks.ClientConfig, aggregator=None,
                server_optimizer=None) -> RoundPieces:
    """The pieces of a communication round of kind `round_spec` (a `RoundSpec` or a
    `tffl.engine.switch_round.SwitchRoundSpec`; see the module docstring).

    `aggregator`: a `tff.aggregators` factory (default `MeanFactory()`: Σ n_iΔ_i/Σ n_i);
    `server_optimizer`: a `tff.learning.optimizers` optimizer (default SGD η_s = 1: w + Δ̄).
    """
    factory, weighted = weighted_factory(aggregator or tff.aggregators.MeanFactory())
    server_optimizer = server_optimizer or tff.learning.optimizers.build_sgdm(1.0)
    client_update = build_client_computation(model, round_spec, client)
    result_type = client_update.type_signature.result[0]
    if round_spec.upload == "factors":
        aggregation = factor_aggregation.stacking_aggregation(result_type.update, factory,
                                                              weighted)
    else:
        aggregation = factory.create(result_type.update, result_type.update_weight)
    step = round_spec.build_server_step(
        model, server_optimizer, aggregation.next.type_signature.result.result.member)
    measure = round_spec.measure(model)
    if measure is not None:
        measure = tff.tensorflow.computation(
            model.layout.global_type(), step.apply.type_signature.parameter[2],
            np.int32)(measure)
    return RoundPieces(round_spec.name, client_update, aggregation, step, measure=measure,
                       round_inputs=_inputs(round_spec, client.hook))


class _FirstOf:
    """A server step on the first entry of a (update, diagnostic) aggregate."""

    def __init__(self, step, aggregate_type: tff.Type):
        params = step.apply.type_signature.parameter

        @tff.tensorflow.computation(params[0], params[1], aggregate_type, np.int32)
        def apply(state, weights, aggregate, round_num):
            return step.apply(state, weights, aggregate[0], round_num)

        self.initialize, self.apply = step.initialize, apply


def with_averaging_error(model: federated_model.FederatedModel, round_spec: RoundSpec,
                         pieces: RoundPieces, pairs: Sequence[tuple[int, int]],
                         aggregator=None) -> RoundPieces:
    """`pieces` (of a "delta" round uploading both factors of every (A, B) in `pairs`, positions
    in `spec.trainable`) that also measure FedAvg-LoRA's averaging error
    ‖Ā·B̄ − mean(A_iB_i)‖_F / ‖mean(A_iB_i) − A·B‖_F (`tffl.engine.factor_aggregation`; weights p_i as
    `aggregator`'s: n_i/Σn if weighted, else 1/N), reported as the finalizer's measurement
    `averaging_error`. Simulation-only: the aggregation reads every client's ΔA_i, ΔB_i a second
    time; `traffic` (the declared bytes) is unchanged and does not count it."""
    uploaded = uploaded_positions(model, round_spec)
    if round_spec.upload != "delta" or any(k not in uploaded for pair in pairs for k in pair):
        raise ValueError(f"round {round_spec.name!r}: the averaging error needs a \"delta\" "
                         "round that uploads both factors of every adapter")
    _, weighted = weighted_factory(aggregator or tff.aggregators.MeanFactory())
    update_pairs = [(uploaded.index(a), uploaded.index(b)) for a, b in pairs]
    aggregation = factor_aggregation.averaging_error_aggregation(
        pieces.aggregator, pieces.upload_type.update, update_pairs, weighted)
    aggregate_type = aggregation.next.type_signature.result.result.member
    layout = model.layout
    measure = factor_aggregation.averaging_error_measure(
        layout.global_type(), [(layout.global_index(a), layout.global_index(b)) for a, b in pairs],
        aggregate_type)
    return dataclasses.replace(pieces, aggregator=aggregation, measure=measure,
                               step=_FirstOf(pieces.step, aggregate_type))
