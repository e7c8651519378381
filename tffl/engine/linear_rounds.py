"""The federated assembly of the linear round with two client exchanges (linear FLUTE's), and its
metrics (part of the linear engine; `tffl.engine.linear_engine` re-exports all of it).

A *two-exchange round* (`build_two_exchange_round`) over the participating clients I (|I| = n),
declared by its TensorFlow pieces (`TwoExchangePieces`, each a `tff.tensorflow.computation`; the
algorithm writes no federated code):

1. the server broadcasts v = `broadcast`(state);
2. client i runs `first_update`(v, data_i[, p_i]) and uploads u_i; the server aggregates
   ū = A_{i∈I} u_i;
3. the server broadcasts r = `second_broadcast`(ū) (default r = ū); client i runs
   `second_update`(v, r, data_i[, p_i]), uploads g_i if it has one (then ḡ = A_{i∈I} g_i) and keeps
   its new personal state p_i' if the round has personal state;
4. the new state is `server_update`(state, ū[, ḡ]);
5. metrics (`round_metrics`), TFF's learning-process structure: `client_work/train` holds
   `loss` = (1/n) Σ_{i∈I} ℓ_i and `num_clients` = n, `finalizer` the entries of
   `server_metrics`(state, ū[, ḡ]) if given (the server step's values); `distributor` and
   `aggregator` are empty.

A is the unweighted mean (1/n) Σ_{i∈I} (`aggregation="mean"`, `tff.federated_mean`) or the sum
Σ_{i∈I} (`"sum"`, `tff.federated_sum`), the same for both exchanges. A client computation's result
is read by name: an `OrderedDict` with entries among `value` (the upload, any structure), `loss`
(ℓ_i, float32) and `personal` (p_i', the second exchange only); a result without any of these
names is the upload itself. ℓ_i comes from whichever exchange returns `loss` (exactly one does).

Instance: linear FLUTE (`tffl.algorithms.flute_linear`; u_i = (∇_B L_i, w_i w_iᵀ) summed, the
server step on B, then r = G = WWᵀ and the head step at the client, at the old B, no second
upload). Its second exchange needs G and the old B, which are not model weights, so it is not
two round kinds of `tffl.engine.composition` (RoLoRA's Alt-min-GD, whose second exchange needs
only the new model weights (a, b̄), is: `tffl.algorithms.rolora_linear`).

Types: `state_type`, `data_type` and `personal_type` are unplaced; the round is

    without personal state: (state@SERVER, data@CLIENTS) -> LearningProcessOutput(state, metrics)
    with personal state:    (state@SERVER, data@CLIENTS, personal@CLIENTS)
                              -> PersonalizedOutput(state@SERVER, personal@CLIENTS, metrics@SERVER)

(the second follows `tffl.engine.personal_state`'s protocol: clients that sit out keep theirs),
the `next` of a `tffl.engine.process.Process`. `two_exchange_traffic` gives its bytes per client
(what TFF's forms cannot hold: the second broadcast depends on the first aggregate).

Example (client i holds a number x_i; the variance needs the mean first, hence two exchanges:
the first means the x_i, the second the squared deviations (x_i − x̄)²; state (x̄, variance)):

>>> scalar = tff.TensorType(np.float32)
>>> state_type = tff.StructWithPythonType([("mean", scalar), ("variance", scalar)],
...                                       collections.OrderedDict)
>>> @tff.tensorflow.computation(state_type)
... def broadcast(state):                     # v: the previous mean
...     return state["mean"]
>>> @tff.tensorflow.computation(scalar, scalar)
... def first(v, x):                          # u_i = x_i
...     return x
>>> @tff.tensorflow.computation(scalar, scalar, scalar)
... def second(v, mean, x):                   # g_i = (x_i − x̄)², ℓ_i = (x_i − v)²
...     return collections.OrderedDict(value=(x - mean) ** 2, loss=(x - v) ** 2)
>>> @tff.tensorflow.computation(state_type, scalar, scalar)
... def server_update(state, mean, variance):
...     return collections.OrderedDict(mean=mean, variance=variance)
>>> pieces = TwoExchangePieces(broadcast, first, second, server_update)
>>> next_fn = build_two_exchange_round(state_type, scalar, pieces)
>>> with runtime.local_runtime():
...     output = next_fn(collections.OrderedDict(mean=0.0, variance=0.0), [1.0, 2.0, 6.0])
>>> {k: round(float(v), 4) for k, v in output.state.items()}
{'mean': 3.0, 'variance': 4.6667}
>>> train = output.metrics["client_work"]["train"]
>>> round(float(train["loss"]), 4), int(train["num_clients"])   # (1+4+36)/3
(13.6667, 3)
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow_federated as tff

from tffl import runtime as _runtime  # noqa: F401  (its exit hook stops every TFF worker)
from tffl.engine import communication
from tffl.engine.personal_state import PersonalizedOutput

_AGGREGATIONS = {"mean": tff.federated_mean, "sum": tff.federated_sum}
_CLIENT_ENTRIES = ("value", "loss", "personal")


@dataclasses.dataclass(frozen=True)
class TwoExchangePieces:
    """The TensorFlow pieces of a two-exchange round (module docstring, steps 1–5), each a
    `tff.tensorflow.computation` on unplaced values.

    Attributes:
      broadcast: state -> v, what the first exchange sends.
      first_update: (v, data[, personal]) -> u_i, or `OrderedDict(value=u_i[, loss=ℓ_i])`.
      second_update: (v, r, data[, personal]) -> g_i, or an `OrderedDict` of `value=g_i`
        (optional), `loss=ℓ_i` (unless the first exchange returns it) and `personal=p_i'`
        (exactly when the round has personal state).
      server_update: (state, ū[, ḡ]) -> the new state (ḡ when the second exchange uploads).
      second_broadcast: ū -> r, what the second exchange sends (None: ū itself).
      server_metrics: (state, ū[, ḡ]) -> `OrderedDict` of extra metrics, reported under
        `finalizer` (None: none).
    """

    broadcast: tff.Computation
    first_update: tff.Computation
    second_update: tff.Computation
    server_update: tff.Computation
    second_broadcast: tff.Computation | None = None
    server_metrics: tff.Computation | None = None


def count_clients():
    """n = the number of participating clients, @SERVER (int32)."""
    return tff.federated_sum(tff.federated_value(np.int32(1), tff.CLIENTS))


def round_metrics(client_loss, **server_values):
    """A linear round's metrics @SERVER in TFF's learning-process structure (as
    `tff.learning.templates.compose_learning_process` builds them), inside a federated
    computation: `OrderedDict(distributor=(), client_work=OrderedDict(train=OrderedDict(
    loss=(1/n) Σ_i ℓ_i, num_clients=n)), aggregator=(), finalizer=OrderedDict(**server_values))`
    (`client_loss` @CLIENTS; the `server_values`, the server step's, @SERVER)."""
    train = tff.federated_zip(collections.OrderedDict(
        loss=tff.federated_mean(client_loss), num_clients=count_clients()))
    finalizer = (tff.federated_zip(collections.OrderedDict(**server_values)) if server_values
                 else tff.federated_value(collections.OrderedDict(), tff.SERVER))
    return tff.federated_zip(collections.OrderedDict(
        distributor=tff.federated_value((), tff.SERVER),
        client_work=tff.federated_zip(collections.OrderedDict(train=train)),
        aggregator=tff.federated_value((), tff.SERVER), finalizer=finalizer))


def client_traffic(down_types, up_types) -> communication.RoundTraffic:
    """Bytes per client of a linear round whose broadcasts have `down_types` and whose client
    results (uploads and ℓ_i) have `up_types`, plus the 4-byte client count of `round_metrics`
    (the figures TFF's forms would give, for rounds they cannot hold)."""
    return communication.RoundTraffic(
        down=sum(communication.type_bytes(t) for t in down_types),
        up=sum(communication.type_bytes(t) for t in up_types) + 4)


def _entries(computation: tff.Computation, role: str) -> tuple[str, ...]:
    """The named entries (`value`, `loss`, `personal`) of a client computation's result, or
    ("value",) when the whole result is the upload; ValueError if it mixes them with others."""
    result = computation.type_signature.result
    names = tff.structure.name_list(result) if isinstance(result, tff.StructType) else []
    if not set(names) & set(_CLIENT_ENTRIES):
        return ("value",)
    unknown = [name for name in names if name not in _CLIENT_ENTRIES]
    if unknown:
        raise ValueError(f"{role}'s result has entries {unknown}; a client result is the upload "
                         f"itself or an OrderedDict with entries among {_CLIENT_ENTRIES}")
    return tuple(names)


def _check_entries(first: tuple[str, ...], second: tuple[str, ...], personal: bool,
                   aggregation: str) -> None:
    """ValueError unless the two exchanges' results fit the round (module docstring)."""
    if aggregation not in _AGGREGATIONS:
        raise ValueError(f"aggregation={aggregation!r} must be one of {', '.join(_AGGREGATIONS)}")
    if "value" not in first:
        raise ValueError("first_update must upload something: its result, or its `value`")
    if ("loss" in first) == ("loss" in second):
        raise ValueError("exactly one of first_update and second_update must return `loss`")
    if "personal" in first:
        raise ValueError("only second_update may return `personal`")
    if ("personal" in second) != personal:
        raise ValueError("second_update must return `personal` exactly when the round has "
                         "personal_type")


def _select(output, entries: tuple[str, ...]) -> dict:
    """{name: federated value@CLIENTS} of a client exchange's output (the whole output when it
    is the upload itself)."""
    if entries == ("value",):
        return {"value": output}
    return {name: getattr(output, name) for name in entries}


def _exchanges(pieces: TwoExchangePieces, aggregation: str, entries: tuple, state, data,
               personal) -> tuple:
    """Steps 1–5 of the round (module docstring) inside a federated computation: (new state@SERVER,
    personal'@CLIENTS or None, metrics@SERVER). `entries`: the two client results' entries."""
    aggregate = _AGGREGATIONS[aggregation]
    first_entries, second_entries = entries
    own = () if personal is None else (personal,)
    sent = tff.federated_broadcast(tff.federated_map(pieces.broadcast, state))
    first = _select(tff.federated_map(pieces.first_update, (sent, data, *own)), first_entries)
    totals = [aggregate(first["value"])]
    relayed = (totals[0] if pieces.second_broadcast is None
               else tff.federated_map(pieces.second_broadcast, totals[0]))
    second = _select(tff.federated_map(pieces.second_update,
                                       (sent, tff.federated_broadcast(relayed), data, *own)),
                     second_entries)
    if "value" in second:
        totals.append(aggregate(second["value"]))
    at_server = tff.federated_zip((state, *totals))
    new_state = tff.federated_map(pieces.server_update, at_server)
    extra = {}
    if pieces.server_metrics is not None:
        values = tff.federated_map(pieces.server_metrics, at_server)
        extra = {name: getattr(values, name)
                 for name in tff.structure.name_list(values.type_signature.member)}
    loss = first["loss"] if "loss" in first else second["loss"]
    return new_state, second.get("personal"), round_metrics(loss, **extra)


def build_two_exchange_round(state_type: tff.Type, data_type: tff.Type,
                             pieces: TwoExchangePieces, *, personal_type: tff.Type | None = None,
                             aggregation: str = "mean") -> tff.Computation:
    """The federated `next` of a round with two client exchanges (module docstring, steps 1–5).

    Args:
      state_type, data_type: the server state's and one client's data's types (unplaced).
      pieces: the round's TensorFlow pieces (`TwoExchangePieces`: the two broadcasts, the two
        client updates, the server update and its metrics).
      personal_type: one client's personal state type, or None for a round without one.
      aggregation: A, "mean" ((1/n) Σ_i, unweighted) or "sum" (Σ_i), for both exchanges.

    Returns:
      Without personal state: (state@SERVER, data@CLIENTS) -> `LearningProcessOutput(state,
      metrics)`; with it: (state@SERVER, data@CLIENTS, personal@CLIENTS) ->
      `PersonalizedOutput(state@SERVER, personal@CLIENTS, metrics@SERVER)`.

    Raises:
      ValueError: an unknown `aggregation`, or client results that do not fit the round (no
        upload in the first exchange, `loss` in neither or both, `personal` misplaced).
    """
    entries = (_entries(pieces.first_update, "first_update"),
               _entries(pieces.second_update, "second_update"))
    _check_entries(*entries, personal_type is not None, aggregation)
    state_at_server = tff.FederatedType(state_type, tff.SERVER)
    data_at_clients = tff.FederatedType(data_type, tff.CLIENTS)

    if personal_type is None:
        @tff.federated_computation(state_at_server, data_at_clients)
        def next_fn(state, data):
            new_state, _, metrics = _exchanges(pieces, aggregation, entries, state, data, None)
            return tff.learning.templates.LearningProcessOutput(new_state, metrics)
        return next_fn

    @tff.federated_computation(state_at_server, data_at_clients,
                               tff.FederatedType(personal_type, tff.CLIENTS))
    def personalized_next_fn(state, data, personal):
        return PersonalizedOutput(*_exchanges(pieces, aggregation, entries, state, data,
                                              personal))

    return personalized_next_fn


def two_exchange_traffic(pieces: TwoExchangePieces) -> communication.RoundTraffic:
    """Bytes per client of `build_two_exchange_round` with these pieces: down v and r; up u_i,
    g_i (if uploaded), ℓ_i and the client count (`client_traffic`)."""

    def sent(computation, role):   # the result entries that leave the client
        result = computation.type_signature.result
        entries = _entries(computation, role)
        if entries == ("value",):
            return [result]
        return [result[n] for n in entries if n != "personal"]

    first = pieces.first_update.type_signature.result
    upload = (first if _entries(pieces.first_update, "first_update") == ("value",)
              else first["value"])
    relayed = (upload if pieces.second_broadcast is None
               else pieces.second_broadcast.type_signature.result)
    return client_traffic([pieces.broadcast.type_signature.result, relayed],
                          sent(pieces.first_update, "first_update")
                          + sent(pieces.second_update, "second_update"))
