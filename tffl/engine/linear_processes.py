"""The Python-facing linear processes: `LinearProcess` and `PersonalizedLinearProcess`.

They hold a linear algorithm's TFF computations (built with `tffl.engine.linear_engine`) and check
shapes before calling them: the representation B (d×k), every client's data (x: (m, d),
y: (m,)) and, for personalized processes, one personal state per client with the shapes of
`personal_shapes` (`tffl.engine.personal_state`'s protocol). `tffl.engine.linear_engine` re-exports both.

Example:

>>> process = LinearProcess(None, None, None, dim=10, rank=2)     # checks only
>>> process.check_data(data)                # `data`: 4 clients of 20 samples, d = 10
>>> process.get_representation({"representation": np.zeros((10, 2), np.float32)}).shape
(10, 2)
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import numpy as np
import tensorflow_federated as tff

from tffl.engine import personal_state


@dataclasses.dataclass(frozen=True)
class LinearProcess:
    """A linear process: state `OrderedDict(representation=float32[d, k], round_num=int32)`.

    Attributes (TFF computations; the methods add shape checks):
      initialize_computation: () -> state@SERVER.
      next_computation: the round (`build_averaging_round` or `build_two_exchange_round`).
      set_representation_computation: (state, float32[d, k]) -> state with that B.
      dim, rank: d, k.
    """

    initialize_computation: tff.Computation
    next_computation: tff.Computation
    set_representation_computation: tff.Computation
    dim: int
    rank: int

    def initialize(self):
        """The initial server state (round_num 0)."""
        return self.initialize_computation()

    @staticmethod
    def get_representation(state) -> np.ndarray:
        """B (d×k, float32) of a state."""
        return np.asarray(state["representation"])

    def set_representation(self, state, representation):
        """A copy of `state` with B = `representation` (d×k), orthonormalized by processes that
        keep B orthonormal (FedRep) and stored as is by the others."""
        shape = np.shape(representation)
        if shape != (self.dim, self.rank):
            raise ValueError(f"representation must have shape ({self.dim}, {self.rank}), "
                             f"got {shape}")
        return self.set_representation_computation(state, np.asarray(representation, np.float32))

    def check_data(self, client_data) -> None:
        """ValueError unless every client's x is (m, d) and y is (m,) with m >= 1."""
        for i, item in enumerate(client_data):
            x, y = np.shape(item["x"]), np.shape(item["y"])
            if len(x) != 2 or x[1] != self.dim or len(y) != 1 or y[0] != x[0] or x[0] < 1:
                raise ValueError(f"client {i}: expected x of shape (m, {self.dim}) and y of shape "
                                 f"(m,) with m >= 1, got {x} and {y}")


@dataclasses.dataclass(frozen=True)
class PersonalizedLinearProcess(LinearProcess):
    """A linear process with personal state at CLIENTS (`tffl.engine.personal_state`'s protocol).

    `next_computation`: (state@SERVER, data@CLIENTS, personal@CLIENTS) ->
    (state@SERVER, personal@CLIENTS, metrics@SERVER). Subclasses define `personal_shapes` (used
    both for the TFF type, via `personal_type`, and for the checks) and `initialize_personal`.
    """

    @staticmethod
    def personal_shapes(dim: int, rank: int) -> collections.OrderedDict:
        """`OrderedDict(name=shape)` of one client's personal state."""
        raise NotImplementedError

    def initialize_personal(self, client_id: Any) -> collections.OrderedDict:
        """Client `client_id`'s initial personal state (numpy float32 arrays)."""
        raise NotImplementedError

    def check_personal(self, client_data, personal_states) -> None:
        """`check_data`, then ValueError unless there is one personal state per client, each
        with the shapes of `personal_shapes`."""
        if len(client_data) != len(personal_states):
            raise ValueError(f"{len(client_data)} clients' data but {len(personal_states)} "
                             "personal states; pass one personal state per client, in order")
        self.check_data(client_data)
        for i, p in enumerate(personal_states):
            for name, expected in self.personal_shapes(self.dim, self.rank).items():
                shape = np.shape(p[name])
                if shape != tuple(expected):
                    raise ValueError(f"client {i}: personal {name} must have shape "
                                     f"{tuple(expected)}, got {shape}")

    def next(self, state, client_data, personal_states) -> personal_state.PersonalizedOutput:
        """One round on `client_data` (a list of `{x: (m_i, d), y: (m_i,)}`) with the clients'
        `personal_states` (same order); returns the new state, personal states and metrics."""
        personal_states = list(personal_states)
        self.check_personal(client_data, personal_states)
        output = self.next_computation(state, client_data, personal_states)
        return personal_state.PersonalizedOutput(*output)

    @staticmethod
    def stack_personal(personal_states, name: str) -> np.ndarray:
        """The clients' `name` entries stacked as rows (M×size, float64)."""
        return np.stack([np.asarray(p[name], np.float64) for p in personal_states])
