"""Federated LoRA as TFF learning processes: FedAvg-LoRA, FFA-LoRA, RoLoRA and FlexLoRA.

Notation (`shared/specs/rolora.md` §1): an adapted matrix is W = W0 + A·B (times the layer's α/r),
A ∈ R^{d_in×r} (role `lora_a`), B ∈ R^{r×d_out} (role `lora_b`, zero at init). N clients, client i
has n_i examples; "mean" is whatever the `tff.aggregators` factory computes (default
`tff.aggregators.MeanFactory()`: Σ_i n_i·v_i / Σ_i n_i; pass `UnweightedMeanFactory()` for the
paper's uniform 1/N). Clients always aggregate *deltas* v_i = θ_i − θ (so DP clipping and noise act
on updates); with a mean, θ + mean(v_i) = mean(θ_i).

One communication round ("sub-round") = broadcast the model weights; every client runs the one
training loop of `tffl.client_training` on the variables of the round's roles, one pass over its
dataset, from the broadcast weights; clients upload only the trained variables' deltas plus two
float32 metric scalars (`loss_sum`, `num_examples`); the server applies the aggregated delta.

| algorithm      | communication rounds per `next` | trained & uploaded (per round)        |
|----------------|----------------------------------|----------------------------------------|
| `fedavg_lora`  | 1                                | A, B (+ `extra_roles`); A ← Ā, B ← B̄ |
| `ffa_lora`     | 1                                | B (+ extra); A frozen at its init      |
| `rolora`       | 2: `b_round` then `a_round`      | B (+ extra), then A (+ extra)          |
| `flexlora`     | 1                                | A, B trained; uploads A_iB_i − AB     |
| `flora`        | 1                                | A_i, B_i (from B = 0); merged into W0 |

RoLoRA's exactness: in the B round every client holds the same A, so mean_i(A·B_i) = A·mean_i(B_i);
in the A round every client holds the same B̄, so mean_i(A_i·B̄) = mean_i(A_i)·B̄. FedAvg-LoRA's
mean_i(A_i)·mean_i(B_i) differs from mean_i(A_i·B_i) in general. RoLoRA starts with the B round
(B = 0 at init makes ∇_A ℓ = 0). TFF has no federated conditional, so one RoLoRA `next` performs
both rounds; its metrics are `{"b_round": ..., "a_round": ...}`. The server state holds
`round_num`, the number of communication rounds done.

FlexLoRA (Bai et al. 2024): clients train A and B; the server forms P = A·B + mean_i(A_iB_i − A·B)
= mean_i(A_iB_i) and takes the rank-r truncated SVD P ≈ U_r S_r V_rᵀ, A = U_r S_r^{1/2},
B = S_r^{1/2} V_rᵀ. In TFF the server only ever sees aggregates, so each client uploads its product
delta (d_in·d_out values per adapted matrix) and the aggregator (replaceable, e.g. DP) acts on it.

FLoRA (Wang et al. 2024): every round starts from a fresh adapter (A random, B = 0); clients train
A and B and upload the factors A_i, B_i; the aggregation "stacks" them along the rank axis,
[p_1A_1 … p_NA_N]·[B_1; …; B_N] = Σ_i p_i·A_i·B_i (a `tff.federated_aggregate` accumulating
p_i·A_i·B_i into a d_in×d_out sum, so the upload stays r·(d_in + d_out) per matrix); the server
merges W0 ← W0 + scale·Σ_i p_i A_iB_i into the frozen kernel the adapter is linked to
(`tffl.roles.link_lora`, scale = the layer's α/r, reshaped to the kernel's shape) and restarts the
adapter: A ← `flora_a_init(seed, round_num)` (identical for all clients), B ← 0. The first round
uses the model's own initial A. TFF's DistributeAggregateForm cannot hold a `federated_aggregate`
(TFF 0.87), so `tffl.communication.round_traffic(process.next)` raises for FLoRA;
`traffic_per_communication_round` reads its traffic off the MapReduceForm instead.

`build_rolora_then_ffa` gives the paper's "x% RoLoRA + (100−x)% FFA-LoRA" schedule.

Variables whose role is not trained in a round keep the broadcast value: `frozen`, and also
`shared` (the default role of an *untagged* trainable variable) unless it is in `extra_roles`.
Build the processes before creating any eager Keras model in the same program: tracing them
builds Keras models in graphs, which invalidates Keras 2 models created eagerly before.
Datasets with dict elements must yield `OrderedDict`s or dicts with sorted keys (a TFF rule).
The processes are assembled directly from `tff.federated_computation`s rather than
`tff.learning.templates.compose_learning_process`, because a RoLoRA `next` is two
broadcast–aggregate rounds, which the four-block composer cannot express; all algorithms share
the same code path (`_SubRound`).

Bytes: the broadcast is the whole `ModelWeights` (frozen weights included, as in TFF's FedAvg);
the upload of a round is the client computation's result type, see
`upload_bytes_per_communication_round`.

Example:

>>> process = build_lora_process("rolora", model_fn, input_spec, client_learning_rate=0.1)
>>> with runtime.local_runtime():
...     state = process.initialize()
...     output = process.next(state, client_datasets)   # a B round, then an A round
...     weights = process.get_model_weights(output.state)
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl import client_training
from tffl import communication
from tffl import roles

ALGORITHMS = ("rolora", "fedavg_lora", "ffa_lora", "flexlora", "flora")
# The float32 scalars every client uploads besides the trained factors: loss sum and example count.
METRIC_UPLOAD_BYTES = 2 * 4

_DELTA = "delta"
_PRODUCT = "product"


def _default_loss() -> tf.keras.losses.Loss:
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def lora_pairs(spec: client_training.ModelSpec) -> list[tuple[int, int]]:
    """Pairs (index of A, index of B) in `spec.trainable`: the k-th `lora_a` with the k-th `lora_b`.

    Raises:
      ValueError: if the counts differ, a pair's names do not share a layer prefix, or the ranks
        (A's last axis, B's first axis) differ.
    """
    a_idx, b_idx = spec.indices([roles.LORA_A]), spec.indices([roles.LORA_B])
    if len(a_idx) != len(b_idx):
        raise ValueError(f"{len(a_idx)} trainable lora_a but {len(b_idx)} lora_b variables")
    pairs = []
    for i, j in zip(a_idx, b_idx):
        a, b = spec.trainable[i], spec.trainable[j]
        if a.name.rsplit("/", 1)[0] != b.name.rsplit("/", 1)[0]:
            raise ValueError(f"cannot pair LoRA factors {a.name} and {b.name} (different layers)")
        if len(a.shape) != 2 or len(b.shape) != 2 or a.shape[1] != b.shape[0]:
            raise ValueError(f"LoRA factors {a.name} {a.shape} and {b.name} {b.shape} do not "
                             "have shapes (d_in, r) and (r, d_out)")
        pairs.append((i, j))
    return pairs


@dataclasses.dataclass(frozen=True)
class _Config:
    keras_model_fn: Callable[[], tf.keras.Model]
    input_spec: object
    loss_fn: Callable[[], client_training.LossFn]
    learning_rate: float
    aggregator: (tff.aggregators.WeightedAggregationFactory
                 | tff.aggregators.UnweightedAggregationFactory)
    spec: client_training.ModelSpec
    extra_roles: tuple[str, ...]
    client_device: str | None = None


class _SubRound:
    """One communication round that trains and aggregates the variables of `train_roles`.

    `client_work`: (ModelWeights, dataset) -> <update, loss_sum, num_examples> (a tf computation);
    `server_apply`: (ModelWeights, aggregated update) -> ModelWeights; `aggregator`: the
    `tff.templates.AggregationProcess` for `update`.
    """

    def __init__(self, name: str, config: _Config, train_roles: Sequence[str], upload: str):
        self.name = name
        spec = config.spec
        self.train_indices = spec.indices(train_roles)
        if not self.train_indices:
            raise ValueError(f"round {name!r}: the model has no trainable variables with roles "
                             f"{list(train_roles)}")
        weights_type = spec.weights_type()
        data_type = tff.SequenceType(client_training.element_type(config.input_spec))
        pairs = lora_pairs(spec) if upload == _PRODUCT else []
        paired = {k for pair in pairs for k in pair}
        # FlexLoRA: one product per (A, B) pair, then the deltas of the other trained variables.
        single = [k for k in self.train_indices if k not in paired]
        position = {k: p for p, k in enumerate(self.train_indices)}

        @tff.tensorflow.computation(weights_type, data_type)
        def client_work(weights, dataset):
            with client_training.placed(config.client_device):
                model = client_training.build_model(config.keras_model_fn, config.input_spec,
                                                    zero_init=True)
                loop = client_training.build_training_loop(
                    model, config.loss_fn(), config.learning_rate, self.train_indices,
                    device=config.client_device)
                new_values, loss_sum, num_examples = loop(weights, dataset)
            old = weights.trainable
            if upload == _PRODUCT:
                update = [new_values[position[a]] @ new_values[position[b]] - old[a] @ old[b]
                          for a, b in pairs]
                update += [new_values[position[k]] - old[k] for k in single]
            else:
                update = [new - old[k] for new, k in zip(new_values, self.train_indices)]
            return collections.OrderedDict(
                update=update, loss_sum=loss_sum, num_examples=num_examples
            )

        update_type = client_work.type_signature.result["update"]

        @tff.tensorflow.computation(weights_type, update_type)
        def server_apply(weights, update):
            trainable = list(weights.trainable)
            if upload == _PRODUCT:
                for (a, b), delta in zip(pairs, update[: len(pairs)]):
                    rank = spec.trainable[a].shape[1]
                    product = trainable[a] @ trainable[b] + delta
                    s, u, v = tf.linalg.svd(product)
                    root = tf.sqrt(s[:rank])
                    trainable[a] = u[:, :rank] * root[tf.newaxis, :]
                    trainable[b] = root[:, tf.newaxis] * tf.transpose(v[:, :rank])
                for k, delta in zip(single, update[len(pairs):]):
                    trainable[k] = trainable[k] + delta
            else:
                for k, delta in zip(self.train_indices, update):
                    trainable[k] = trainable[k] + delta
            return tff.learning.models.ModelWeights(
                trainable=trainable, non_trainable=list(weights.non_trainable)
            )

        self.aggregator, self.weighted = _create_aggregator(config.aggregator, update_type)
        self.client_work = client_work
        self.server_apply = server_apply

    def upload_type(self) -> tff.Type:
        """What one client sends in this round: the result type of `client_work`."""
        return self.client_work.type_signature.result

    def initialize_aggregator(self):
        return self.aggregator.initialize()

    def run(self, model, aggregator_state, data, round_num=None):
        """Federated body: (model@S, aggregator state@S, data@C) -> (model, state, metrics)@S.

        `round_num` (unused here) is the server's count of communication rounds after this one.
        """
        at_clients = tff.federated_broadcast(model)
        out = tff.federated_map(self.client_work, (at_clients, data))
        if self.weighted:
            agg = self.aggregator.next(aggregator_state, out.update, out.num_examples)
        else:
            agg = self.aggregator.next(aggregator_state, out.update)
        new_model = tff.federated_map(self.server_apply, (model, agg.result))
        metrics = tff.federated_zip(
            collections.OrderedDict(train=_train_metrics(out), aggregator=agg.measurements)
        )
        return new_model, agg.state, metrics


def _create_aggregator(factory, update_type):
    """(`tff.templates.AggregationProcess` for `update_type`, whether it is weighted)."""
    if isinstance(factory, tff.aggregators.WeightedAggregationFactory):
        return factory.create(update_type, tff.TensorType(np.float32)), True
    if isinstance(factory, tff.aggregators.UnweightedAggregationFactory):
        return factory.create(update_type), False
    raise TypeError("aggregator must be a tff.aggregators Weighted- or "
                    f"UnweightedAggregationFactory, got {type(factory).__name__}")


def _train_metrics(out):
    """Federated: the `train` metrics (example-weighted loss, example count) of a round."""
    loss_sum = tff.federated_sum(out.loss_sum)
    num_examples = tff.federated_sum(out.num_examples)
    loss = tff.federated_map(_safe_divide, (loss_sum, num_examples))
    return tff.federated_zip(collections.OrderedDict(loss=loss, num_examples=num_examples))


def flora_a_init(shape: tuple[int, int], seed: int, round_num, pair: int, num_pairs: int
                 ) -> tf.Tensor:
    """FLoRA's fresh A for communication round `round_num` (a tf function of a scalar tensor):

        A ~ U(−1/√d_in, 1/√d_in),  `tf.random.stateless_uniform(shape, [seed, t·L + k])`

    with t = `round_num` (a scalar tensor: the communication rounds done, ≥ 1), k = `pair`
    (position of the adapter among the L = `num_pairs` linked adapters). Drawn by the server, the
    same for all clients; PEFT's default LoRA-A distribution. (Round 0 uses the model's own A.)
    """
    bound = 1.0 / np.sqrt(shape[0])
    stream = tf.cast(round_num, tf.int64) * num_pairs + pair
    return tf.random.stateless_uniform(
        shape, tf.stack([tf.constant(seed, tf.int64), stream]), minval=-bound, maxval=bound
    )


class _FloraRound:
    """FLoRA's communication round (Wang et al. 2024, `rolora.md` §1.4.4).

    Every client trains (A, B) (+ the `extra_roles` variables) from the broadcast adapter, in which
    B = 0, and uploads its factors A_i (d_in×r), B_i (r×d_out) — not their product. The
    aggregation "stacks" them: [p_1A_1 … p_NA_N]·[B_1; …; B_N] = Σ_i p_i·A_i·B_i, computed by a
    `tff.federated_aggregate` whose accumulate step adds p_i·A_i·B_i into a d_in×d_out accumulator
    (p_i = n_i/Σn with a weighted `aggregator`, 1/N with an unweighted one). The server merges
    W0 ← W0 + scale·reshape(Σ_i p_i A_iB_i, W0.shape) into each linked frozen kernel, then
    restarts the adapter: A ← `flora_a_init(…, round_num)`, B ← 0. The `extra_roles` deltas go
    through `aggregator` (which therefore does not act on the factors: no DP on them).
    """

    def __init__(self, name: str, config: _Config, seed: int):
        self.name = name
        spec = config.spec
        links = spec.links
        linked = {link.a_index for link in links}
        unlinked = [spec.trainable[i].name for i in spec.indices([roles.LORA_A])
                    if i not in linked]
        if unlinked:
            raise ValueError(
                "FLoRA merges each adapter into its frozen base kernel, so every lora_a must be "
                "linked to one with tffl.roles.link_lora (models.lora_layers does this); "
                f"unlinked: {', '.join(unlinked)}"
            )
        self.train_indices = spec.indices((roles.LORA_A, roles.LORA_B, *config.extra_roles))
        paired = {k for link in links for k in (link.a_index, link.b_index)}
        single = [k for k in self.train_indices if k not in paired]
        position = {k: p for p, k in enumerate(self.train_indices)}
        weights_type = spec.weights_type()
        data_type = tff.SequenceType(client_training.element_type(config.input_spec))
        dims = [(spec.trainable[link.a_index].shape[0], spec.trainable[link.b_index].shape[1])
                for link in links]
        dtype = spec.trainable[links[0].a_index].dtype

        @tff.tensorflow.computation(weights_type, data_type)
        def client_work(weights, dataset):
            with client_training.placed(config.client_device):
                model = client_training.build_model(config.keras_model_fn, config.input_spec,
                                                    zero_init=True)
                loop = client_training.build_training_loop(
                    model, config.loss_fn(), config.learning_rate, self.train_indices,
                    device=config.client_device)
                new_values, loss_sum, num_examples = loop(weights, dataset)
            factors = [(new_values[position[link.a_index]], new_values[position[link.b_index]])
                       for link in links]
            update = [new_values[position[k]] - weights.trainable[k] for k in single]
            return collections.OrderedDict(
                factors=factors, update=update, loss_sum=loss_sum, num_examples=num_examples
            )

        result_type = client_work.type_signature.result
        factors_type = result_type["factors"]
        self.has_update = bool(single)
        if self.has_update:
            self.aggregator, self.weighted = _create_aggregator(config.aggregator,
                                                                result_type["update"])
        else:
            _, self.weighted = _create_aggregator(config.aggregator, tff.TensorType(np.float32))
            self.aggregator = None

        @tff.tensorflow.computation
        def zero():
            return collections.OrderedDict(
                products=[tf.zeros(d, dtype) for d in dims], weight=tf.constant(0.0, tf.float32)
            )

        acc_type = zero.type_signature.result

        def add_products(acc, factors, weight):
            return collections.OrderedDict(
                products=[p + tf.cast(weight, p.dtype) * (a @ b)
                          for p, (a, b) in zip(acc["products"], factors)],
                weight=acc["weight"] + weight,
            )

        if self.weighted:
            @tff.tensorflow.computation(acc_type, (factors_type, np.float32))
            def accumulate(acc, value):
                factors, weight = value
                return add_products(acc, factors, weight)
        else:
            @tff.tensorflow.computation(acc_type, factors_type)
            def accumulate(acc, factors):
                return add_products(acc, factors, tf.constant(1.0, tf.float32))

        @tff.tensorflow.computation(acc_type, acc_type)
        def merge(x, y):
            return collections.OrderedDict(
                products=[p + q for p, q in zip(x["products"], y["products"])],
                weight=x["weight"] + y["weight"],
            )

        @tff.tensorflow.computation(acc_type)
        def report(acc):
            return [tf.math.divide_no_nan(p, tf.cast(acc["weight"], p.dtype))
                    for p in acc["products"]]

        self._zero, self._accumulate, self._merge, self._report = zero, accumulate, merge, report
        products_type = report.type_signature.result
        update_type = result_type["update"]

        @tff.tensorflow.computation(weights_type, products_type, update_type, np.int32)
        def server_apply(weights, products, update, round_num):
            trainable, non_trainable = list(weights.trainable), list(weights.non_trainable)
            for k, (link, product) in enumerate(zip(links, products)):
                base = trainable if link.base_trainable else non_trainable
                kernel = base[link.base_index]
                base[link.base_index] = kernel + tf.cast(
                    link.scale * tf.reshape(product, tf.shape(kernel)), kernel.dtype)
                a, b = trainable[link.a_index], trainable[link.b_index]
                trainable[link.a_index] = tf.cast(
                    flora_a_init(tuple(a.shape), seed, round_num, k, len(links)), a.dtype)
                trainable[link.b_index] = tf.zeros_like(b)
            for k, delta in zip(single, update):
                trainable[k] = trainable[k] + delta
            return tff.learning.models.ModelWeights(trainable=trainable,
                                                    non_trainable=non_trainable)

        self.client_work = client_work
        self.server_apply = server_apply

    def upload_type(self) -> tff.Type:
        """What one client sends: its factors (+ extra-role deltas) and the two metric scalars."""
        return self.client_work.type_signature.result

    def initialize_aggregator(self):
        if self.aggregator is not None:
            return self.aggregator.initialize()
        return tff.federated_value(np.int32(0), tff.SERVER)   # placeholder state

    def run(self, model, aggregator_state, data, round_num=None):
        at_clients = tff.federated_broadcast(model)
        out = tff.federated_map(self.client_work, (at_clients, data))
        value = (tff.federated_zip((out.factors, out.num_examples)) if self.weighted
                 else out.factors)
        products = tff.federated_aggregate(value, self._zero(), self._accumulate, self._merge,
                                           self._report)
        if self.aggregator is None:
            update, new_agg_state = tff.federated_value([], tff.SERVER), aggregator_state
            measurements = tff.federated_value(collections.OrderedDict(), tff.SERVER)
        elif self.weighted:
            agg = self.aggregator.next(aggregator_state, out.update, out.num_examples)
            update, new_agg_state, measurements = agg.result, agg.state, agg.measurements
        else:
            agg = self.aggregator.next(aggregator_state, out.update)
            update, new_agg_state, measurements = agg.result, agg.state, agg.measurements
        new_model = tff.federated_map(self.server_apply, (model, products, update, round_num))
        metrics = tff.federated_zip(
            collections.OrderedDict(train=_train_metrics(out), aggregator=measurements)
        )
        return new_model, new_agg_state, metrics


@tff.tensorflow.computation(np.float32, np.float32)
def _safe_divide(a, b):
    return tf.math.divide_no_nan(a, b)


class LoraLearningProcess(tff.learning.templates.LearningProcess):
    """A `LearningProcess` that also exposes its communication rounds.

    Attributes:
      algorithm: the algorithm name.
      communication_rounds: `{name: computation}`, each a standalone federated computation
        `(state@SERVER, data@CLIENTS) -> <state, metrics>` of that one communication round, in
        the order `next` runs them (so `tffl.communication.round_traffic` can size each).
      upload_types: `{name: type}`, what one client uploads in that round.
    """

    def __init__(self, algorithm, initialize_fn, next_fn, get_fn, set_fn, communication_rounds,
                 upload_types, spec: client_training.ModelSpec | None = None):
        super().__init__(initialize_fn, next_fn, get_fn, set_fn)
        self.algorithm = algorithm
        self.communication_rounds = communication_rounds
        self.upload_types = upload_types
        self.spec = spec

    @property
    def set_model_weights(self):
        """`(state, ModelWeights) -> state`; the weights' shapes are checked against the model's
        first (e.g. LoRA factors of another rank raise a `ValueError` naming the variable)."""
        if self.spec is None:
            return self._set_model_weights
        return _CheckedSetWeights(self._set_model_weights, self.spec)


class _CheckedSetWeights:
    """The `set_model_weights` computation behind a shape check against a `ModelSpec`; other
    attributes (e.g. `type_signature`) are the computation's."""

    def __init__(self, computation, spec: client_training.ModelSpec):
        self._computation, self._spec = computation, spec

    def __getattr__(self, name):
        return getattr(self._computation, name)

    def __call__(self, state, weights):
        check_weights_shapes(self._spec, weights)
        return self._computation(state, weights)


def check_weights_shapes(spec: client_training.ModelSpec, weights) -> None:
    """Checks `weights` (`ModelWeights` or `(trainable, non_trainable)`) against `spec`.

    Raises:
      ValueError: a count differs, or a value's shape differs from its variable's, naming the
        variable, its role and both shapes (e.g. LoRA factors of another rank).
    """
    if hasattr(weights, "trainable"):
        groups = (weights.trainable, weights.non_trainable)
    else:
        groups = tuple(weights)
    for kind, infos, values in zip(("trainable", "non_trainable"),
                                   (spec.trainable, spec.non_trainable), groups):
        values = list(values)
        if len(values) != len(infos):
            raise ValueError(f"set_model_weights: the model has {len(infos)} {kind} variables, "
                             f"got {len(values)} values")
        for info, value in zip(infos, values):
            shape = tuple(np.shape(value))
            if shape != info.shape:
                raise ValueError(
                    f"set_model_weights: {kind} variable {info.name} (role {info.role}) has shape "
                    f"{info.shape} in this process's model, got a value of shape {shape}"
                    + (" (LoRA factors of another rank?)"
                       if info.role in (roles.LORA_A, roles.LORA_B) else "")
                )


def _increment(k: int) -> tff.Computation:
    @tff.tensorflow.computation(np.int32)
    def add(n):
        return n + k

    return add


def _compose(algorithm: str, config: _Config, sub_rounds: Sequence[_SubRound]
             ) -> LoraLearningProcess:
    """Assembles the process: state = <model, round_num, aggregator: {round name: state}>."""
    spec = config.spec
    weights_type = spec.weights_type()

    @tff.tensorflow.computation
    def initial_weights():
        model = client_training.build_model(config.keras_model_fn, config.input_spec)
        return tff.learning.models.ModelWeights(
            trainable=[v.read_value() for v in model.trainable_variables],
            non_trainable=[v.read_value() for v in model.non_trainable_variables],
        )

    @tff.federated_computation
    def initialize():
        states = collections.OrderedDict(
            (r.name, r.initialize_aggregator()) for r in sub_rounds
        )
        return tff.federated_zip(collections.OrderedDict(
            model=tff.federated_eval(initial_weights, tff.SERVER),
            round_num=tff.federated_value(np.int32(0), tff.SERVER),
            aggregator=tff.federated_zip(states),
        ))

    state_type = initialize.type_signature.result
    data_type = tff.FederatedType(
        tff.SequenceType(client_training.element_type(config.input_spec)), tff.CLIENTS
    )

    def build_next(rounds: Sequence[_SubRound], single: bool):
        @tff.federated_computation(state_type, data_type)
        def next_fn(state, data):
            model = state.model
            agg_states = collections.OrderedDict(
                (r.name, state.aggregator[r.name]) for r in sub_rounds
            )
            metrics = collections.OrderedDict()
            for k, r in enumerate(rounds):
                # The count of communication rounds once `r` is done (FLoRA seeds its new A by it).
                round_num = (tff.federated_map(_increment(k + 1), state.round_num)
                             if isinstance(r, _FloraRound) else None)
                model, agg_states[r.name], metrics[r.name] = r.run(
                    model, agg_states[r.name], data, round_num)
            new_state = tff.federated_zip(collections.OrderedDict(
                model=model,
                round_num=tff.federated_map(_increment(len(rounds)), state.round_num),
                aggregator=tff.federated_zip(agg_states),
            ))
            metrics = metrics[rounds[0].name] if single else tff.federated_zip(metrics)
            return tff.learning.templates.LearningProcessOutput(new_state, metrics)

        return next_fn

    next_fn = build_next(sub_rounds, single=len(sub_rounds) == 1)
    rounds = collections.OrderedDict(
        (r.name, build_next([r], single=True)) for r in sub_rounds
    )

    @tff.tensorflow.computation(state_type.member)
    def get_model_weights(state):
        return state["model"]

    @tff.tensorflow.computation(state_type.member, weights_type)
    def set_model_weights(state, weights):
        return collections.OrderedDict(
            model=weights, round_num=state["round_num"], aggregator=state["aggregator"]
        )

    upload_types = collections.OrderedDict((r.name, r.upload_type()) for r in sub_rounds)
    return LoraLearningProcess(algorithm, initialize, next_fn, get_model_weights,
                               set_model_weights, rounds, upload_types, spec)


def _config(keras_model_fn, input_spec, client_learning_rate, loss_fn, aggregator, extra_roles,
            client_device=None) -> _Config:
    if not client_learning_rate > 0:
        raise ValueError(f"client_learning_rate={client_learning_rate} must be > 0")
    extra_roles = tuple(extra_roles)
    for role in extra_roles:
        if role not in roles.ROLES or role in (roles.LORA_A, roles.LORA_B, roles.FROZEN):
            raise ValueError(f"extra_roles may hold {roles.HEAD!r}, {roles.SHARED!r} or "
                             f"{roles.SHORTCUT!r}, got {role!r}")
    spec = client_training.inspect_model(keras_model_fn, input_spec)
    found = {v.role for v in spec.trainable}
    if roles.LORA_A not in found or roles.LORA_B not in found:
        names = ", ".join(f"{v.name}:{v.role}" for v in spec.trainable) or "none"
        raise ValueError(
            "the model has no trainable LoRA factors: it needs variables tagged "
            f"'{roles.LORA_A}' and '{roles.LORA_B}' (tffl.roles.tag); trainable variables: {names}"
        )
    lora_pairs(spec)  # validates the factor shapes
    return _Config(
        keras_model_fn=keras_model_fn,
        input_spec=input_spec,
        loss_fn=loss_fn or _default_loss,
        learning_rate=float(client_learning_rate),
        aggregator=aggregator if aggregator is not None else tff.aggregators.MeanFactory(),
        spec=spec,
        extra_roles=extra_roles,
        client_device=client_device,
    )


_BUILDER_DOC_ARGS = """
    Args:
      keras_model_fn: no-arg function returning a fresh, uncompiled Keras model whose variables
        carry `tffl.roles` (at least one `lora_a` and one `lora_b`).
      input_spec: element spec `(x, y)` (or `{"x", "y"}`) of a client's batched dataset.
      client_learning_rate: local SGD step size η > 0; local steps = batches in the dataset.
      loss_fn: no-arg function returning the batch loss `(y_true, y_pred) -> scalar` (default:
        sparse categorical cross-entropy on logits).
      aggregator: a `tff.aggregators` factory for the uploaded deltas, weighted (weights =
        examples) or unweighted (default `tff.aggregators.MeanFactory()`).
      extra_roles: roles trained and aggregated with the factors in every round (default: `head`).
      client_device: a TensorFlow device for each client's model and training loop, e.g.
        "/GPU:0" (`tffl.client_training.placed`); default: TensorFlow's own placement.

    Raises:
      ValueError: the model has no `lora_a`/`lora_b` variables, or the learning rate is not > 0.
"""


def build_fedavg_lora(keras_model_fn, input_spec, client_learning_rate, loss_fn=None,
                      aggregator=None, extra_roles=(roles.HEAD,), client_device=None
                      ) -> LoraLearningProcess:
    """FedAvg-LoRA (FedIT): clients train A and B; the server sets A ← mean A_i, B ← mean B_i."""
    config = _config(keras_model_fn, input_spec, client_learning_rate, loss_fn, aggregator,
                     extra_roles, client_device)
    train = (roles.LORA_A, roles.LORA_B, *config.extra_roles)
    return _compose("fedavg_lora", config, [_SubRound("ab_round", config, train, _DELTA)])


def build_ffa_lora(keras_model_fn, input_spec, client_learning_rate, loss_fn=None,
                   aggregator=None, extra_roles=(roles.HEAD,), client_device=None
                      ) -> LoraLearningProcess:
    """FFA-LoRA: A stays at its (common) initial value; clients train B; B ← mean B_i."""
    config = _config(keras_model_fn, input_spec, client_learning_rate, loss_fn, aggregator,
                     extra_roles, client_device)
    train = (roles.LORA_B, *config.extra_roles)
    return _compose("ffa_lora", config, [_SubRound("b_round", config, train, _DELTA)])


def build_rolora(keras_model_fn, input_spec, client_learning_rate, loss_fn=None,
                 aggregator=None, extra_roles=(roles.HEAD,), client_device=None
                      ) -> LoraLearningProcess:
    """RoLoRA: each `next` is a B round (A frozen, B ← mean B_i) then an A round (B ← B̄ frozen,
    A ← mean A_i); each round has its own aggregator state; `round_num` grows by 2."""
    config = _config(keras_model_fn, input_spec, client_learning_rate, loss_fn, aggregator,
                     extra_roles, client_device)
    return _compose("rolora", config, [
        _SubRound("b_round", config, (roles.LORA_B, *config.extra_roles), _DELTA),
        _SubRound("a_round", config, (roles.LORA_A, *config.extra_roles), _DELTA),
    ])


def build_flexlora(keras_model_fn, input_spec, client_learning_rate, loss_fn=None,
                   aggregator=None, extra_roles=(roles.HEAD,), client_device=None
                      ) -> LoraLearningProcess:
    """FlexLoRA: clients train A and B and upload A_iB_i − AB; the server sets A = U_r S_r^{1/2},
    B = S_r^{1/2} V_rᵀ from the truncated SVD of mean_i(A_iB_i)."""
    config = _config(keras_model_fn, input_spec, client_learning_rate, loss_fn, aggregator,
                     extra_roles, client_device)
    train = (roles.LORA_A, roles.LORA_B, *config.extra_roles)
    return _compose("flexlora", config, [_SubRound("ab_round", config, train, _PRODUCT)])


def build_flora(keras_model_fn, input_spec, client_learning_rate, loss_fn=None,
                aggregator=None, extra_roles=(roles.HEAD,), seed: int = 0, client_device=None
                ) -> LoraLearningProcess:
    """FLoRA: clients train A, B from (A, B = 0) and upload A_i, B_i; the server merges
    W0 ← W0 + scale·Σ_i p_i·A_i·B_i (stacking) and restarts the adapter (A ← `flora_a_init` with
    `seed` and the round number, B ← 0). Every `lora_a` must be linked to its frozen kernel
    (`tffl.roles.link_lora`); `aggregator` sets p_i (weighted: n_i/Σn, unweighted: 1/N) and
    aggregates the `extra_roles` deltas."""
    config = _config(keras_model_fn, input_spec, client_learning_rate, loss_fn, aggregator,
                     extra_roles, client_device)
    return _compose("flora", config, [_FloraRound("ab_round", config, int(seed))])


for _builder in (build_fedavg_lora, build_ffa_lora, build_rolora, build_flexlora, build_flora):
    if _builder.__doc__:  # None under `python -OO`
        _builder.__doc__ += _BUILDER_DOC_ARGS

_BUILDERS = {
    "rolora": build_rolora,
    "fedavg_lora": build_fedavg_lora,
    "ffa_lora": build_ffa_lora,
    "flexlora": build_flexlora,
    "flora": build_flora,
}


def build_lora_process(name: str, keras_model_fn, input_spec, client_learning_rate, **kwargs
                       ) -> LoraLearningProcess:
    """The process of algorithm `name` (one of `ALGORITHMS`); `kwargs` go to its builder.

    Raises:
      ValueError: for an unknown name.
    """
    if name not in _BUILDERS:
        raise ValueError(
            f"unknown LoRA algorithm {name!r}; expected one of {', '.join(ALGORITHMS)}"
        )
    return _BUILDERS[name](keras_model_fn, input_spec, client_learning_rate, **kwargs)


def upload_bytes_per_communication_round(process: LoraLearningProcess) -> dict[str, int]:
    """Bytes one client uploads in each communication round of one `next`, from the types.

    = Σ over the round's uploaded tensors of prod(shape)·itemsize, i.e. the trained factors'
    deltas (+ `extra_roles` variables) plus `METRIC_UPLOAD_BYTES` (two float32 metric scalars).
    """
    return {name: communication.type_bytes(t) for name, t in process.upload_types.items()}


def traffic_per_communication_round(
    process: LoraLearningProcess,
) -> dict[str, communication.RoundTraffic]:
    """`tffl.communication.round_traffic` of each communication round's own computation (FLoRA's
    round holds a `tff.federated_aggregate`, so its figure comes from the MapReduceForm)."""
    return {name: communication.round_traffic(comp)
            for name, comp in process.communication_rounds.items()}


class RoloraThenFfa:
    """"x% RoLoRA + (100−x)% FFA-LoRA" (`rolora.md` §1.3 (ii)): RoLoRA for the first
    `switch_round` communication rounds, then only B rounds (A frozen from then on).

    Not a single TFF computation (TFF has no federated conditional): `next` reads `round_num` from
    the server state and calls the RoLoRA process's `next` (a B and an A round) while
    `round_num + 2 <= switch_round`, else its standalone `b_round` computation (one B round).
    Metrics are `{"b_round": ..., "a_round": ...}` or `{"b_round": ...}` accordingly. It has the
    `initialize` / `next` / `get_model_weights` / `set_model_weights` of a `LearningProcess`, and
    its state is the RoLoRA process's state, so `tffl.simulation.run_rounds` and checkpoints work
    (one driver round = 2 communication rounds before the switch, 1 after it).
    """

    def __init__(self, rolora: LoraLearningProcess, switch_round: int):
        if rolora.algorithm != "rolora":
            raise ValueError(f"expected a RoLoRA process, got {rolora.algorithm!r}")
        if switch_round < 0:
            raise ValueError(f"switch_round={switch_round} must be >= 0")
        self.rolora = rolora
        self.switch_round = int(switch_round)
        self.initialize = rolora.initialize
        self.get_model_weights = rolora.get_model_weights
        self.set_model_weights = rolora.set_model_weights

    def next(self, state, client_data) -> tff.learning.templates.LearningProcessOutput:
        if int(state["round_num"]) + 2 <= self.switch_round:
            return self.rolora.next(state, client_data)
        output = self.rolora.communication_rounds["b_round"](state, client_data)
        return tff.learning.templates.LearningProcessOutput(
            output.state, collections.OrderedDict(b_round=output.metrics)
        )


def build_rolora_then_ffa(rolora_fraction: float, total_communication_rounds: int,
                          keras_model_fn, input_spec, client_learning_rate, **kwargs
                          ) -> RoloraThenFfa:
    """RoLoRA for the first round(x·T) communication rounds, FFA-LoRA after (x = `rolora_fraction`,
    T = `total_communication_rounds`); `kwargs` as for `build_rolora`.

    Raises:
      ValueError: x outside [0, 1] or T < 1 (and as `build_rolora`).
    """
    if not 0.0 <= rolora_fraction <= 1.0:
        raise ValueError(f"rolora_fraction={rolora_fraction} must be in [0, 1]")
    if total_communication_rounds < 1:
        raise ValueError(f"total_communication_rounds={total_communication_rounds} must be >= 1")
    process = build_rolora(keras_model_fn, input_spec, client_learning_rate, **kwargs)
    return RoloraThenFfa(process, round(rolora_fraction * total_communication_rounds))
