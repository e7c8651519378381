"""What a client does around its training loop: `ClientConfig` (optimizer, weight decay, hook,
XLA) and `ClientHook`, the algorithm-specific steps (FLUTE's penalties, class indicator and NC
step; heterogeneous ranks' truncation) with the round inputs the server may broadcast.

>>> round_inputs(None), ClientConfig(optimizer=0.1).weight_decay
((), 0.0)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow_federated as tff


class ClientHook:
    """Algorithm-specific client steps around the loop (FLUTE's penalties, class indicator and
    NC step; the heterogeneous ranks' truncation). `extra_types`: tensors appended to the
    personal state. `round_inputs`: values of the round the server broadcasts to every client
    with the weights, passed to `finish` as keyword arguments; the one supported is
    `"num_clients"`, |I| (float32), counted by a `federated_sum` of one per client before the
    broadcast."""

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


ROUND_INPUTS = ("num_clients",)
# Bytes per client and round of each round input: one float32 up (the count's 1) and one down.
ROUND_INPUT_BYTES = 4


def round_inputs(hook: ClientHook | None) -> tuple[str, ...]:
    names = tuple(hook.round_inputs) if hook is not None else ()
    unknown = [n for n in names if n not in ROUND_INPUTS]
    if unknown:
        raise ValueError(f"unsupported round inputs {unknown}; supported: {ROUND_INPUTS}")
    return names


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """Client training: the `tff.learning.optimizers` optimizer (or SGD step) and weight decay."""

    optimizer: Any
    weight_decay: float = 0.0
    hook: ClientHook | None = None
    # Mark each local step for XLA (`build_phased_loop`); TFF 0.87's worker does not compile it.
    jit_compile: bool = False
