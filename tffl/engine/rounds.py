"""The one engine: a communication round built from `tff.learning.templates` pieces, and
processes that run an algorithm as a schedule of such rounds.

A communication round (`build_round`) is TFF's four typed pieces over the federated weights w of
a `FederatedModel` (its `tffl.engine.frozen.Layout`; the frozen base never travels):

1. distributor: `tff.learning.templates.build_broadcast_process` of w;
2. client work: one `tff.tensorflow.computation` per client — build the Keras model, restore the
   base weights from their checkpoint file, assemble w (+ the client's personal state), run the
   round's phases with `tffl.engine.client_training.build_phased_loop` (a `tff.learning.optimizers`
   client optimizer), and upload `ClientResult(update, update_weight = n_i)`; its train metrics
   (loss, accuracy, examples) go through `tff.learning.metrics.sum_then_finalize`;
3. aggregator: any `tff.aggregators` factory (weighted; unweighted ones via
   `tff.aggregators.as_weighted_aggregator`), or, for uploaded factors (FLoRA, FlexLoRA), the
   stacking sum Σ p_i A_iB_i (`tffl.engine.factor_aggregation`);
4. finalizer: a `tffl.engine.server_steps` step (a `tff.learning.optimizers` server optimizer by
   default; FlexLoRA's SVD; FLoRA's merge), plus the round's measurements if it has any
   (`with_averaging_error`).

`build_evaluation` is the personalized evaluation on the same model assembly (each client its
federated weights, frozen weights and personal state, optionally fine-tuned, on its test data).

Stateless rounds are composed by `tff.learning.templates.compose_learning_process`; rounds with
personal state use `composition.compose_round`, the same composition with the personal state passed
in and returned at CLIENTS. All round kinds of one algorithm share one state type (the
aggregator and finalizer states are keyed by round kind; the finalizer counts `round_num`), so a
schedule is a function t ↦ round kind and `next` runs one communication round on its own data:

    LearningAlgorithmState(global_model_weights = w, distributor, client_work,
                           aggregator = {round: state}, finalizer = {round_num, round: state})

Example:

>>> from tffl.engine.federated_model import ModelSource
>>> model = build_federated_model(ModelSource(model_fn, input_spec),
...                               federated=spec.indices(["lora_a", "lora_b", "head"]))
>>> b_round = RoundSpec("b_round", (client_training.Phase(spec.indices(["lora_b", "head"])),))
>>> pieces = build_round(model, b_round, ClientConfig(optimizer=client_training.as_optimizer(0.1)))
>>> pieces.traffic.down, pieces.traffic.up      # 4·(16 + 16 + 27) down; 4·(16 + 27) + 16 up
(236, 188)
>>> from tffl.engine import composition
>>> from tffl.engine import schedules       # FFA-LoRA: the B round every time
>>> ffa = composition.build_process("ffa_lora", model, [pieces], schedules.constant("b_round"))
>>> list(ffa.rounds), ffa.personal is None      # a `LearningProcess` of one round kind
(['b_round'], True)
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.engine import client_training
from tffl.engine import communication
from tffl.engine import factor_aggregation
from tffl.engine import server_steps
from tffl.engine.client_hooks import (  # noqa: F401  (public here)
    ROUND_INPUT_BYTES, ROUND_INPUTS, ClientConfig, ClientHook, round_inputs)
from tffl.engine.federated_evaluation import build_evaluation  # noqa: F401  (public here)
from tffl.engine.federated_model import (  # noqa: F401  (public here)
    FederatedModel, build_federated_model, personal_type)

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
      links: FLoRA's `client_training.LinkInfo`s (same order as `pairs`); seed: its A seed.
    """

    name: str
    phases: tuple[client_training.Phase, ...]
    upload: str = "delta"
    uploaded: tuple[int, ...] | None = None
    server_step: str = "optimizer"
    pairs: tuple[tuple[int, int], ...] = ()
    links: tuple[client_training.LinkInfo, ...] = ()
    seed: int = 0


def _uploaded(model: FederatedModel, round_spec: RoundSpec) -> tuple[int, ...]:
    if round_spec.uploaded is not None:
        return tuple(round_spec.uploaded)
    trained = {k for phase in round_spec.phases for k in phase.train_indices}
    return tuple(k for k in model.layout.trainable if k in trained)


def _check_round_spec(round_spec: RoundSpec) -> None:
    upload, step = round_spec.upload, round_spec.server_step
    if upload not in UPLOADS:
        raise ValueError(f"upload={upload!r} must be one of {UPLOADS}")
    if step not in SERVER_STEPS:
        raise ValueError(f"server_step={step!r} must be one of {SERVER_STEPS}")
    if (upload == "factors") != (step in ("svd", "merge")):
        raise ValueError(f"round {round_spec.name!r}: server_step={step!r} does not take "
                         f"upload={upload!r} (\"svd\" and \"merge\" take \"factors\", "
                         "\"optimizer\" takes \"delta\")")
    if upload == "factors" and not round_spec.pairs:
        raise ValueError(f"round {round_spec.name!r}: upload=\"factors\" needs pairs")


def _singles(model: FederatedModel, round_spec: RoundSpec) -> list[int]:
    """Positions in `spec.trainable` uploaded as deltas (all of `uploaded` but the factors)."""
    paired = ({k for pair in round_spec.pairs for k in pair} if round_spec.upload == "factors"
              else set())
    return [k for k in _uploaded(model, round_spec) if k not in paired]


def build_client_computation(model: FederatedModel, round_spec: RoundSpec,
                             client: ClientConfig) -> tff.Computation:
    """`(w, data[, personal]) -> (ClientResult, metric sums, personal)`: one client's round."""
    layout, has_personal = model.layout, bool(model.layout.personal)
    _check_round_spec(round_spec)
    singles = _singles(model, round_spec)
    hook = client.hook

    inputs = round_inputs(hook)

    def work(weights, dataset, personal, round_values=()):
        with client_training.placed(model.client_device):
            keras_model = client_training.build_model(model.keras_model_fn, model.input_spec,
                                                      zero_init=True)
            personal = list(personal)
            own, extra = personal[: len(layout.personal)], personal[len(layout.personal):]
            full = layout.assemble(weights, model.frozen.restore(),
                                   own if has_personal else None)
            phases, features_model, context = round_spec.phases, None, None
            if hook is not None:
                phases, features_model, context = hook.prepare(keras_model, extra, dataset,
                                                               phases)
            loop = client_training.build_phased_loop(
                keras_model, model.loss_fn(), client.optimizer, phases, features_model,
                device=model.client_device, weight_decay=client.weight_decay,
                jit_compile=client.jit_compile)
            out = loop(full if hook is None else hook.start(full, context), dataset)
        trained, extra_out = list(out["trainable"]), []
        if hook is not None:
            trained, extra_out = hook.finish(trained, context,
                                             **dict(zip(inputs, list(round_values))))
        old = full.trainable
        deltas = [trained[k] - old[k] for k in singles]
        if round_spec.upload == "factors":
            update = ([(trained[a], trained[b]) for a, b in round_spec.pairs], deltas)
        else:
            update = deltas
        result = tff.learning.templates.ClientResult(update=update,
                                                     update_weight=out["num_examples"])
        metrics = collections.OrderedDict(loss_sum=out["loss_sum"],
                                          num_correct=out["num_correct"],
                                          num_examples=out["num_examples"])
        return result, metrics, [trained[k] for k in layout.personal] + list(extra_out)

    global_type, data_type = layout.global_type(), model.data_type()
    if inputs:
        values_type = tff.types.to_type([np.float32] * len(inputs))

        @tff.tensorflow.computation(global_type, data_type, personal_type(model, hook),
                                    values_type)
        def client_update(weights, dataset, personal, round_values):
            return work(weights, dataset, personal, round_values)
    elif has_personal or (hook and hook.extra_types):
        @tff.tensorflow.computation(global_type, data_type, personal_type(model, hook))
        def client_update(weights, dataset, personal):
            return work(weights, dataset, personal)
    else:
        @tff.tensorflow.computation(global_type, data_type)
        def client_update(weights, dataset):
            return work(weights, dataset, [])
    return client_update


def _finalize_metrics(sums):
    n = sums["num_examples"]
    return collections.OrderedDict(
        loss=tf.math.divide_no_nan(sums["loss_sum"], n),
        accuracy=tf.math.divide_no_nan(sums["num_correct"], n), num_examples=n)


def train_metrics(metric_sums, finalize=None):
    """Federated: `sum_then_finalize` of the clients' metric sums -> `finalize(Σ_i sums_i)`,
    by default {loss, accuracy, num_examples} of a Keras round."""
    return tff.federated_zip(collections.OrderedDict(
        train=tff.learning.metrics.sum_then_finalize(finalize or _finalize_metrics)(
            metric_sums)))


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


@dataclasses.dataclass
class RoundPieces:
    """The four pieces of one round kind, before the shared-state keying."""

    name: str
    client_update: tff.Computation
    aggregator: tff.templates.AggregationProcess
    step: Any  # a `tffl.engine.server_steps` step
    traffic: communication.RoundTraffic
    upload_type: tff.Type
    # `(w, diagnostic aggregate) -> measurements`, or None. With it, the aggregator's result is
    # (the step's update, the diagnostic aggregate) and the finalizer reports the measurements.
    measure: tff.Computation | None = None
    # The client work keeps the round number t as its state and each client gets t beside the
    # weights (`client_update(w, data, t)`; `tffl.engine.switch_round`).
    round_counter: bool = False
    # `round_num -> measurements` the finalizer also reports (e.g. a switch round's kind).
    round_measure: tff.Computation | None = None
    # Σ_i (metric sums of client i) -> the round's `client_work/train` metrics (TF); None: a
    # Keras round's {loss, accuracy, num_examples} (`train_metrics`).
    finalize_metrics: Any = None


def build_round(model: FederatedModel, round_spec: RoundSpec, client: ClientConfig,
                aggregator=None, server_optimizer=None) -> RoundPieces:
    """The pieces of a communication round of kind `round_spec` (see the module docstring).

    `aggregator`: a `tff.aggregators` factory (default `MeanFactory()`: Σ n_iΔ_i/Σ n_i);
    `server_optimizer`: a `tff.learning.optimizers` optimizer (default SGD η_s = 1: w + Δ̄).
    """
    factory, weighted = weighted_factory(aggregator or tff.aggregators.MeanFactory())
    server_optimizer = server_optimizer or tff.learning.optimizers.build_sgdm(1.0)
    client_update = build_client_computation(model, round_spec, client)
    result_type = client_update.type_signature.result[0]
    update_type = result_type.update
    if round_spec.upload == "factors":
        aggregation = factor_aggregation.stacking_aggregation(update_type, factory, weighted)
    else:
        aggregation = factory.create(update_type, result_type.update_weight)
    step = _server_step(model, round_spec, aggregation.next.type_signature.result.result.member,
                        server_optimizer)
    traffic = communication.declared_traffic(
        model.layout.global_type(), client_update,
        ROUND_INPUT_BYTES * len(round_inputs(client.hook)))
    return RoundPieces(round_spec.name, client_update, aggregation, step, traffic,
                       client_update.type_signature.result[0])


def with_averaging_error(model: FederatedModel, round_spec: RoundSpec, pieces: RoundPieces,
                         pairs: Sequence[tuple[int, int]], aggregator=None) -> RoundPieces:
    """`pieces` (of a "delta" round uploading both factors of every (A, B) in `pairs`, positions
    in `spec.trainable`) that also measure FedAvg-LoRA's averaging error
    ‖Ā·B̄ − mean(A_iB_i)‖_F / ‖mean(A_iB_i) − A·B‖_F (`tffl.engine.factor_aggregation`; weights p_i as
    `aggregator`'s: n_i/Σn if weighted, else 1/N), reported as the finalizer's measurement
    `averaging_error`. Simulation-only: the aggregation reads every client's ΔA_i, ΔB_i a second
    time; `traffic` (the declared bytes) is unchanged and does not count it."""
    uploaded = _uploaded(model, round_spec)
    if round_spec.upload != "delta" or any(k not in uploaded for pair in pairs for k in pair):
        raise ValueError(f"round {round_spec.name!r}: the averaging error needs a \"delta\" "
                         "round that uploads both factors of every adapter")
    _, weighted = weighted_factory(aggregator or tff.aggregators.MeanFactory())
    update_pairs = [(uploaded.index(a), uploaded.index(b)) for a, b in pairs]
    aggregation = factor_aggregation.averaging_error_aggregation(
        pieces.aggregator, pieces.upload_type.update, update_pairs, weighted)
    layout = model.layout
    measure = factor_aggregation.averaging_error_measure(
        layout.global_type(), [(layout.global_index(a), layout.global_index(b)) for a, b in pairs],
        aggregation.next.type_signature.result.result.member[1])
    return dataclasses.replace(pieces, aggregator=aggregation, measure=measure)
