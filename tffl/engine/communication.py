"""Bytes per client per round, read off the TFF types that cross the SERVER/CLIENTS boundary.

TFF compiles a round (`process.next`) into a `DistributeAggregateForm` (DAF, or a `MapReduceForm`
where it cannot build a DAF): the values the server
broadcasts are the result of `server_to_client_broadcast` (placed at CLIENTS), and everything a client
sends back is the result of `client_work` (placed at CLIENTS, the inputs of the aggregation). The
size of one client's copy of a type is the sum over its tensors of

    bytes(tensor) = prod(shape) * itemsize(dtype)

so nothing here is a formula typed by hand for one algorithm: change what a process broadcasts or
uploads and the figure changes with it.

Example:

>>> traffic = round_traffic(process.rounds["b_round"])    # RoLoRA's B round, d = 8, r = 2
>>> traffic.down, traffic.up   # bytes per client per round
(236, 188)

Down: A (8×2), B (2×8) and the head (8×3 + 3) as float32, 4·59 = 236 bytes; up: the deltas of B
and the head, 4·43 = 172, plus the 4-byte client weight and 12 bytes of metrics = 188.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow_federated as tff


@dataclasses.dataclass(frozen=True)
class RoundTraffic:
    """Bytes one client receives (`down`) and sends (`up`) in one call of `next`."""

    down: int
    up: int


def type_bytes(type_spec: tff.Type) -> int:
    """Bytes of one instance of `type_spec` (placement ignored; sequences count as 0).

    Raises:
      ValueError: if a tensor in `type_spec` has an unknown dimension.
    """
    if isinstance(type_spec, tff.FederatedType):
        return type_bytes(type_spec.member)
    if isinstance(type_spec, tff.StructType):
        return sum(type_bytes(member) for member in type_spec)
    if isinstance(type_spec, tff.TensorType):
        shape = tuple(type_spec.shape)  # TFF 0.87: a tuple of ints (None where unknown)
        if any(dim is None for dim in shape):
            raise ValueError(f"cannot size tensor type {type_spec}: its shape is not fully known")
        dtype = type_spec.dtype
        itemsize = np.dtype(getattr(dtype, "as_numpy_dtype", dtype)).itemsize
        return int(np.prod(shape, dtype=np.int64)) * int(itemsize)
    if isinstance(type_spec, tff.SequenceType):
        return 0  # client data never crosses the boundary
    raise ValueError(f"cannot size TFF type {type_spec} ({type(type_spec).__name__})")


def declared_traffic(broadcast_type: tff.Type, client_update: tff.Computation,
                     extra: RoundTraffic | None = None, weighted: bool = True) -> RoundTraffic:
    """A round's bytes per client from the types of its pieces, for rounds neither TFF form can
    hold (personal state returned at CLIENTS): down = `broadcast_type` (what the server sends,
    e.g. the federated weights), up = the client update's `ClientResult` (its update, and its
    weight when the aggregation is `weighted`) and metric sums (the first two entries of its
    result); `extra` (e.g. the round inputs broadcast beside the weights) is added."""
    result = client_update.type_signature.result
    upload = result[0] if weighted else result[0].update
    extra = extra or RoundTraffic(down=0, up=0)
    return RoundTraffic(down=type_bytes(broadcast_type) + extra.down,
                        up=type_bytes(upload) + type_bytes(result[1]) + extra.up)


def round_traffic(next_computation: tff.Computation) -> RoundTraffic:
    """Per-client bytes down and up of one round of `next_computation` (a federated computation).

    Read off TFF's DistributeAggregateForm; where TFF 0.87 cannot build that form (a round that
    uses `tff.federated_aggregate`, e.g. FLoRA's stacking), off its MapReduceForm instead:
    down = the client input that `prepare` produces, up = the result of `work` (everything a
    client feeds into the aggregations).

    Raises:
      ValueError: if TFF can express the computation in neither form.
    """
    try:
        daf = tff.backends.mapreduce.get_distribute_aggregate_form_for_computation(
            next_computation
        )
        return RoundTraffic(
            down=type_bytes(daf.server_to_client_broadcast.type_signature.result),
            up=type_bytes(daf.client_work.type_signature.result),
        )
    except Exception as daf_error:  # TFF raises several internal error types here.
        try:
            form = tff.backends.mapreduce.get_map_reduce_form_for_computation(next_computation)
        except Exception as mrf_error:
            raise ValueError(
                "cannot derive client traffic: TFF could not compile `next` to "
                f"DistributeAggregateForm ({type(daf_error).__name__}: {daf_error}) nor to "
                f"MapReduceForm ({type(mrf_error).__name__}: {mrf_error})"
            ) from mrf_error
        return RoundTraffic(
            down=type_bytes(form.prepare.type_signature.result),
            up=type_bytes(form.work.type_signature.result),
        )
