"""tffl.engine.communication: bytes per client from TFF types, checked against closed forms."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tffl.engine import communication


def test_type_bytes_closed_form():
    t = tff.StructType([("w", tff.TensorType(np.float32, [3, 4])), ("n", tff.TensorType(np.int64))])
    assert communication.type_bytes(t) == 3 * 4 * 4 + 8
    assert communication.type_bytes(tff.FederatedType(t, tff.CLIENTS)) == 56
    assert communication.type_bytes(tff.SequenceType(tff.TensorType(np.float32, [2]))) == 0


def test_unknown_dimension_is_an_error():
    with pytest.raises(ValueError, match="not fully known"):
        communication.type_bytes(tff.TensorType(np.float32, [None, 4]))


def test_round_traffic_of_a_broadcast_and_upload():
    """Server broadcasts float32[10]; each client uploads float32[5] and an int32 weight."""

    @tff.tensorflow.computation(tff.TensorType(np.float32, [10]))
    def client_fn(w):
        return w[:5] * 2.0

    @tff.federated_computation(
        tff.FederatedType(tff.TensorType(np.float32, [10]), tff.SERVER),
        tff.FederatedType(tff.TensorType(np.int32), tff.CLIENTS),
    )
    def next_fn(server_w, client_n):
        at_clients = tff.federated_broadcast(server_w)
        update = tff.federated_map(client_fn, at_clients)
        return server_w, (tff.federated_sum(update), tff.federated_sum(client_n))

    traffic = communication.round_traffic(next_fn)
    assert traffic.down == 10 * 4
    assert traffic.up == 5 * 4 + 4
