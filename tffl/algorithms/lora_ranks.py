"""Heterogeneous client ranks for FlexLoRA and FLoRA: each client trains its adapters at its own
rank r_i ≤ r, the rank of the server's adapters.

A client of rank r_i keeps the first r_i columns of every A (d_in×r) and the first r_i rows of
every B (r×d_out) and zeroes the rest before it trains:

    A_i ← A·diag(m),  B_i ← diag(m)·B,  m = (1, …, 1, 0, …, 0) with r_i ones.

The zeroed slices stay zero: ∇_A ℓ = xᵀG·Bᵀ has zero columns where B has zero rows, and
∇_B ℓ = (xA)ᵀG has zero rows where A has zero columns (and SGD, momentum, Adam and weight decay
all map a zero gradient on a zero weight to zero). So the client trains exactly a rank-r_i
adapter A_i[:, :r_i]·B_i[:r_i, :] in a model of the server's shapes, and the one TFF client
computation serves every rank.

- **FlexLoRA** (Bai et al. 2024): the server holds A = U_r S_r^{1/2}, B = S_r^{1/2} V_rᵀ, the
  rank-r truncated SVD of P = Σ_i p_i A_iB_i; the first r_i columns/rows are the rank-r_i
  truncation of P that FlexLoRA sends a rank-r_i client. Clients upload their factors
  (A_i, B_i), whose products have rank ≤ r_i, and the stacking gives P (as in FLoRA).
- **FLoRA** (Wang et al. 2024): every client starts from the first r_i columns of the round's
  fresh A and B = 0.

Both stack the uploaded factors, Σ_i p_i·A_iB_i = [p_1A_1 … p_NA_N]·[B_1; …; B_N]: with factors
of different ranks it is the same sum with the zeroed slices.

Every client uses the model's LoRA scale α/r (r the server's rank), so adapters of different
ranks add up on one scale. The rank of a client is its personal state (an int32 scalar, kept by
`tffl.simulation.driver`'s store and its checkpoints); the process is a personalized `Process` whose
`next(state, client_data, personal_states)` leaves it unchanged. The TFF types carry r: the
bytes a rank-r_i client needs are `traffic_at_rank`.

Example:

>>> from tffl.algorithms.lora_plans import FederatedLoraConfig
>>> from tffl.engine.federated_model import ModelSource
>>> config = FederatedLoraConfig(ModelSource(model_fn, input_spec), 0.1,
...                              client_ranks={"a": 1, "b": 2})
>>> process = build_heterogeneous_rank_process("flexlora", config)  # adapters: r = 2
>>> personal = [process.initialize_personal(c) for c in ("a", "b")]
>>> [int(np.asarray(p).reshape(-1)[0]) for p in personal]
[1, 2]
>>> with runtime.local_runtime():
...     state = process.initialize()
...     output = process.next(state, datasets, personal)   # the ranks are left unchanged
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.algorithms import lora_plans
from tffl.engine import communication
from tffl.engine import process as process_lib
from tffl.engine import rounds
from tffl.engine.client_hooks import ClientConfig, ClientHook
from tffl.engine.personal_state import PersonalSpec

# The algorithms that aggregate adapters of different ranks.
RANK_AGGREGATING_ALGORITHMS = ("flexlora", "flora")


class RankTruncation(ClientHook):
    """The client's start: every (A, B) pair of `pairs` (positions in `spec.trainable`) truncated
    to the rank in the client's personal state; the rank goes back unchanged."""

    extra_types = (tff.TensorType(np.int32),)

    def __init__(self, pairs):
        self.pairs = tuple(pairs)

    def prepare(self, model, extra, dataset, phases):
        del model, dataset
        return phases, None, extra[0]

    def start(self, weights, context):
        trainable = list(weights.trainable)
        for a, b in self.pairs:
            keep = tf.cast(tf.range(trainable[a].shape[1]) < context, trainable[a].dtype)
            trainable[a] = trainable[a] * keep[tf.newaxis, :]
            trainable[b] = trainable[b] * keep[:, tf.newaxis]
        return tff.learning.models.ModelWeights(trainable=trainable,
                                                non_trainable=list(weights.non_trainable))

    def finish(self, trained, context, **round_values):
        del round_values
        return trained, [context]


def assign_ranks(client_ids, ranks) -> dict[str, int]:
    """`{client id: rank}` with `ranks` assigned to the clients in turn (client k gets
    ranks[k mod len(ranks)]), e.g. ranks (4, 8, 16) over five clients: 4, 8, 16, 4, 8."""
    ranks = [int(r) for r in ranks]
    if not ranks:
        raise ValueError("client ranks: give at least one rank")
    return {cid: ranks[k % len(ranks)] for k, cid in enumerate(client_ids)}


class ClientRanks:
    """Each client's rank r_i (`lookup(client_id)`), checked against the adapters' rank r."""

    def __init__(self, lookup: Callable[[str], int], max_rank: int):
        self._lookup, self.max_rank = lookup, int(max_rank)

    def __call__(self, client_id: str) -> int:
        rank = int(self._lookup(client_id))
        if not 1 <= rank <= self.max_rank:
            raise ValueError(f"client {client_id!r} has rank {rank}: client ranks must be "
                             f"between 1 and the adapters' rank {self.max_rank} (build the model "
                             "with the largest client rank)")
        return rank

    def personal_spec(self) -> PersonalSpec:
        """A client's personal state: its rank, an int32 scalar."""
        return PersonalSpec(
            names=("rank",), shapes=((),), dtypes=(np.dtype(np.int32),),
            initial=lambda client_id: [np.array(self(client_id), np.int32)])


def _rank_lookup(client_ranks) -> Callable[[str], int]:
    if callable(client_ranks):
        return client_ranks
    if isinstance(client_ranks, Mapping):
        ranks = dict(client_ranks)

        def lookup(client_id):
            if client_id not in ranks:
                raise ValueError(f"client {client_id!r} has no rank in client_ranks "
                                 f"({len(ranks)} clients have one)")
            return ranks[client_id]

        return lookup
    raise ValueError("client_ranks must map client ids to ranks (e.g. assign_ranks(ids, "
                     f"(4, 8, 16))) or be a function of the client id, got {type(client_ranks)}")


def build_heterogeneous_rank_process(algorithm: str, config: lora_plans.FederatedLoraConfig
                                     ) -> process_lib.Process:
    """FlexLoRA or FLoRA (`algorithm`) with per-client ranks: `config.client_ranks` maps a client
    id to its rank (a `Mapping` or a function), each between 1 and the model's LoRA rank; the
    rest of `config` as `tffl.algorithms.lora_fl.build_schedule` takes it. The process's
    personal state is each client's rank, `process.config` the `ClientRanks`, and
    `client_traffic` the bytes at the clients' ranks.

    Raises:
      ValueError: another algorithm, a rank outside [1, r] in a mapping, or as `build_schedule`.
    """
    if algorithm not in RANK_AGGREGATING_ALGORITHMS:
        raise ValueError("heterogeneous client ranks need "
                         f"{' or '.join(RANK_AGGREGATING_ALGORITHMS)} (they "
                         f"aggregate adapters of different ranks), got {algorithm!r}")
    client_ranks = config.client_ranks
    lookup = _rank_lookup(client_ranks)
    plan = lora_plans.plan_schedule(algorithm, config)
    spec = plan.model.spec
    pairs = lora_plans.lora_pairs(spec)
    max_rank = max(spec.trainable[a].shape[1] for a, _ in pairs)
    hook = RankTruncation(pairs)
    client = ClientConfig(plan.client.optimizer, plan.client.weight_decay, hook=hook,
                          jit_compile=plan.client.jit_compile)
    pieces = [rounds.build_round(plan.model, s, client, plan.aggregator, plan.server_optimizer)
              for s in plan.round_specs]
    ranks = ClientRanks(lookup, max_rank)
    if isinstance(client_ranks, Mapping):
        for client_id in client_ranks:
            ranks(client_id)
    at_rank = {}   # {rank: {round kind: RoundTraffic}}, filled as clients of a rank appear

    def client_traffic(round_name, client_id):
        rank = ranks(client_id)
        if rank not in at_rank:
            at_rank[rank] = traffic_at_rank(process, rank)
        return at_rank[rank][round_name]

    process = process_lib.build_process(
        algorithm, pieces, process_lib.Federated(plan.model.initial_weights(),
                                                 plan.model.data_type(), ranks.personal_spec()),
        plan.schedule, process_lib.ProcessSupport(model=plan.model, hook=hook,
                                                  client_traffic=client_traffic, config=ranks))
    return process


def traffic_at_rank(process, rank: int) -> dict[str, communication.RoundTraffic]:
    """`{round kind: RoundTraffic}` for a client of `rank`: the TFF types' bytes (rank r) less
    the (r − rank)·(d_in + d_out) factor values per adapter it neither needs down (its
    truncation) nor sends up (FlexLoRA and FLoRA upload the factors, whose last r − rank
    columns of A_i and rows of B_i are zero)."""
    spec = process.spec
    max_rank = max(spec.trainable[a].shape[1] for a, _ in process.hook.pairs)
    if not 1 <= int(rank) <= max_rank:
        raise ValueError(f"rank {rank} must be between 1 and the adapters' rank {max_rank}")
    saved = 0
    for a, b in process.hook.pairs:
        factor_a, factor_b = spec.trainable[a], spec.trainable[b]
        unused = max(factor_a.shape[1] - int(rank), 0)
        saved += unused * (factor_a.shape[0] * np.dtype(factor_a.dtype).itemsize
                           + factor_b.shape[1] * np.dtype(factor_b.dtype).itemsize)
    return {name: communication.RoundTraffic(down=traffic.down - saved, up=traffic.up - saved)
            for name, traffic in process.traffic.items()}


__all__ = ["RANK_AGGREGATING_ALGORITHMS", "ClientRanks", "RankTruncation", "assign_ranks",
           "build_heterogeneous_rank_process", "traffic_at_rank"]
