"""What a client does around its training loop: `ClientConfig` (optimizer, weight decay, hook,
XLA) and `ClientHook`, the algorithm-specific steps (FLUTE's penalties, class indicator and NC
step; heterogeneous ranks' truncation), with the round inputs the server may broadcast beside
the weights (`ROUND_INPUTS`).

>>> round_inputs(None), ClientConfig(optimizer=0.1).weight_decay
((), 0.0)
>>> str(round_inputs_type(("num_clients",)))
'<num_clients=float32>'
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow_federated as tff

from tffl.engine import communication


class ClientHook:
    """Algorithm-specific client steps around the loop (FLUTE's penalties, class indicator and
    NC step; the heterogeneous ranks' truncation). `extra_types`: tensors appended to the
    personal state. `round_inputs`: values of the round the server broadcasts to every client
    with the weights (`ROUND_INPUTS`), passed to `finish` as keyword arguments."""

    extra_types: tuple[tff.Type, ...] = ()
    round_inputs: tuple[str, ...] = ()

    def prepare(self, model, extra, dataset, phases):
        """-> (phases, features_model or None, context)."""
        return phases, None, None

    def start(self, weights, context):
        """The client's starting weights from the assembled ones (e.g. a rank truncation); the
        update is still taken against the assembled weights."""
        del context
        return weights

    def finish(self, trained, context, **round_values):
        """-> (trained values, extra personal tensors)."""
        return trained, []


# The values a round may broadcast to its clients beside the weights, by name, with their dtype:
# `num_clients`, |I| (counted by a `federated_sum` of one per client, so each client also sends
# a float32 up), and `round_num`, t, the communication rounds done (the finalizer's counter).
ROUND_INPUTS = {"num_clients": np.float32, "round_num": np.int32}
# Bytes per client of each round input: (down, up).
_INPUT_BYTES = {"num_clients": (4, 4), "round_num": (4, 0)}


def checked_inputs(names: Sequence[str]) -> tuple[str, ...]:
    """`names` as a tuple; ValueError naming any that is not one of `ROUND_INPUTS`."""
    names = tuple(names)
    unknown = [n for n in names if n not in ROUND_INPUTS]
    if unknown:
        raise ValueError(f"unsupported round inputs {unknown}; supported: {tuple(ROUND_INPUTS)}")
    return names


def round_inputs(hook: ClientHook | None) -> tuple[str, ...]:
    """The round inputs `hook` takes (none without a hook)."""
    return checked_inputs(hook.round_inputs) if hook is not None else ()


def round_inputs_type(names: Sequence[str]) -> tff.StructWithPythonType:
    """The type of a client's round values: `OrderedDict(name=value)` for `names`."""
    return tff.StructWithPythonType(
        [(n, tff.TensorType(ROUND_INPUTS[n])) for n in checked_inputs(names)],
        collections.OrderedDict)


def round_input_traffic(names: Sequence[str]) -> communication.RoundTraffic:
    """Bytes per client of the round inputs `names`: each down, and |I|'s one up."""
    return communication.RoundTraffic(down=sum(_INPUT_BYTES[n][0] for n in checked_inputs(names)),
                                      up=sum(_INPUT_BYTES[n][1] for n in names))


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """Client training: the `tff.learning.optimizers` optimizer (or SGD step) and weight decay."""

    optimizer: Any
    weight_decay: float = 0.0
    hook: ClientHook | None = None
    # Mark each local step for XLA (`build_phased_loop`); TFF 0.87's worker does not compile it.
    jit_compile: bool = False
