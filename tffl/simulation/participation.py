"""Who takes part in a round: client samplers for the simulation loop.

A sampler maps a round number to the ids of the clients that train in it, plus any per-round
facts to report (for example SRPFL's simulated wall-clock). Sampling is a pure function of
`(seed, round_num)`, so a resumed run picks exactly the clients an uninterrupted run would have.

Example:

>>> sampler = UniformSampler(["a", "b", "c", "d"], clients_per_round=2, seed=0)
>>> sampler.sample(1).client_ids
['b', 'd']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Participation:
    """The clients of one round and what the sampler reports about it."""

    client_ids: list[str]
    info: dict[str, float] = dataclasses.field(default_factory=dict)


class UniformSampler:
    """`clients_per_round` clients drawn uniformly without replacement, independently per round.

    Args:
      client_ids: the population.
      clients_per_round: clients per round, 1 <= clients_per_round <= len(client_ids).
      seed: base seed; round `t` uses the generator seeded with `(seed, t)`.
    """

    def __init__(self, client_ids: Sequence[str], clients_per_round: int, seed: int):
        self.client_ids = list(client_ids)
        if not self.client_ids:
            raise ValueError("UniformSampler needs at least one client id")
        if not 1 <= clients_per_round <= len(self.client_ids):
            raise ValueError(
                f"clients_per_round={clients_per_round} must be between 1 and the number of "
                f"clients ({len(self.client_ids)})"
            )
        self.clients_per_round = clients_per_round
        self.seed = seed

    def sample(self, round_num: int) -> Participation:
        rng = np.random.default_rng((self.seed, round_num))
        chosen = rng.choice(len(self.client_ids), size=self.clients_per_round, replace=False)
        return Participation([self.client_ids[i] for i in chosen])


class FullParticipation:
    """Every client, every round."""

    def __init__(self, client_ids: Sequence[str]):
        self.client_ids = list(client_ids)
        if not self.client_ids:
            raise ValueError("FullParticipation needs at least one client id")

    def sample(self, round_num: int) -> Participation:
        del round_num
        return Participation(list(self.client_ids))
