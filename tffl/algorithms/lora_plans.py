"""Federated LoRA algorithms before composition: their configuration (`FederatedLoraConfig`), the
model's LoRA factors, each algorithm's round kinds and schedule (`plan_schedule`), shared by
`tffl.algorithms.lora_fl` (equal ranks) and `tffl.algorithms.lora_ranks` (per-client ranks),
which compose them.

| algorithm    | round kinds (roles trained; upload; server step)            | schedule          |
|--------------|-------------------------------------------------------------|-------------------|
| `fedavg_lora`| `ab_round`: A, B, extra; deltas; optimizer                  | constant          |
| `ffa_lora`   | `b_round`: B, extra; deltas; optimizer                      | constant          |
| `rolora`     | `b_round`, `a_round`: B or A, extra; deltas; optimizer      | B, A, B, A, ...   |
| `rolora_ffa` | `b_or_a_round`: B or A by round number, as RoLoRA then B     | constant          |
| `flexlora`   | `ab_round`: A, B, extra; factors; SVD of Σ p_i A_iB_i       | constant          |
| `flora`      | `ab_round`: A, B, extra; factors; merge into W0, fresh A    | constant          |

A new algorithm is one more builder of the same form (`fedavg_lora_momentum`: FedAvg-LoRA with
a momentum server optimizer), run by `plan_schedule` like the registered ones.

>>> [pair for pair in lora_pairs(spec)]        # (index of A, index of B) in spec.trainable
[(0, 1)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow_federated as tff

from tffl.engine import client_training
from tffl.engine import model_spec
from tffl.engine import roles
from tffl.engine import rounds
from tffl.engine import schedules
from tffl.engine.client_hooks import ClientConfig
from tffl.engine.federated_model import FederatedModel, ModelSource, build_federated_model
from tffl.engine.switch_round import SwitchRoundSpec


@dataclasses.dataclass(frozen=True)
class FederatedLoraConfig:
    """How a federated-LoRA algorithm runs (PEFT's `LoraConfig` and `models.lora_targets.LoraConfig`
    hold the adapter; this holds its federation). Defaults: the paper's plain mean and SGD server
    step with η_s = 1.

    Attributes:
      model: the Keras model (`tffl.engine.federated_model.ModelSource`), whose variables carry
        `tffl.engine.roles` (at least one `lora_a` and one `lora_b`).
      client_optimizer: local SGD step η > 0, or a `tff.learning.optimizers.Optimizer`; local
        steps = batches in the dataset.
      aggregator: a `tff.aggregators` factory for the uploads, weighted (weights = examples) or
        unweighted (default `MeanFactory()`).
      server_optimizer: a `tff.learning.optimizers.Optimizer` on the mean delta (default SGD
        η_s = 1: the plain mean).
      extra_roles: roles trained and aggregated with the factors every round (default `head`).
      weight_decay: λ ≥ 0, the clients' coupled L2 (g + λθ).
      seed: FLoRA's seed for the fresh A of every round.
      rolora_fraction, total_rounds: rolora_ffa: RoLoRA for round(x·T) communication rounds of
        T, then FFA-LoRA's B rounds.
      client_ranks: flexlora, flora: each client's rank (`{client id: rank}` or a function of
        the client id, each in [1, the model's LoRA rank]); the process is then a personalized
        `Process` (the rank is the clients' personal state, `tffl.algorithms.lora_ranks`).
      averaging_error: fedavg_lora only: also report, in every round's metrics under
        `finalizer/averaging_error`, ‖mean(A_i)·mean(B_i) − mean(A_iB_i)‖_F /
        ‖mean(A_iB_i) − A·B‖_F over all adapters (`tffl.engine.factor_aggregation`; the means
        with the aggregator's weights p_i, A, B the round's starting factors). A
        simulation-only diagnostic: its second aggregation of the clients' ΔA_i, ΔB_i is not
        counted in `traffic` (the algorithm's own upload), and TFF can then compile the round
        to MapReduceForm only.
      jit_compile: mark each client step for XLA (`tf.function(jit_compile=True)`). Only a
        TensorFlow runtime with XLA compiles it: TFF 0.87's `worker_binary` has none and runs
        the step as it is (same results, same time; docs/PERFORMANCE.md, "XLA").
    """

    model: ModelSource
    client_optimizer: Any
    aggregator: Any = None
    server_optimizer: Any = None
    extra_roles: tuple[str, ...] = (roles.HEAD,)
    weight_decay: float = 0.0
    seed: int = 0
    rolora_fraction: float = 0.5
    total_rounds: int | None = None
    client_ranks: Any = None
    averaging_error: bool = False
    jit_compile: bool = False

    def switch_round(self) -> int:
        """rolora_ffa's switch: the communication round round(x·T) from which only B rounds
        run (ValueError without T, or for x outside [0, 1] or T < 1)."""
        if self.total_rounds is None:
            raise ValueError("rolora_ffa needs FederatedLoraConfig(total_rounds=T): it switches to "
                             "FFA-LoRA after round(rolora_fraction·T) communication rounds")
        if not 0.0 <= self.rolora_fraction <= 1.0:
            raise ValueError(f"rolora_fraction={self.rolora_fraction} must be in [0, 1]")
        if self.total_rounds < 1:
            raise ValueError(f"total_rounds={self.total_rounds} must be >= 1")
        return round(self.rolora_fraction * self.total_rounds)



def lora_pairs(spec: model_spec.ModelSpec) -> list[tuple[int, int]]:
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


def _inspect(source: ModelSource, extra_roles) -> model_spec.ModelSpec:
    for role in extra_roles:
        if role not in roles.ROLES or role in (roles.LORA_A, roles.LORA_B, roles.FROZEN):
            raise ValueError(f"extra_roles may hold {roles.HEAD!r}, {roles.SHARED!r} or "
                             f"{roles.SHORTCUT!r}, got {role!r}")
    spec = source.spec()
    found = {v.role for v in spec.trainable}
    if roles.LORA_A not in found or roles.LORA_B not in found:
        names = ", ".join(f"{v.name}:{v.role}" for v in spec.trainable) or "none"
        raise ValueError(
            "the model has no trainable LoRA factors: it needs variables tagged "
            f"'{roles.LORA_A}' and '{roles.LORA_B}' (tffl.engine.roles.tag); trainable variables: {names}"
        )
    lora_pairs(spec)  # validates the factor shapes
    return spec


def _round(spec, name, train_roles, **kwargs) -> rounds.RoundSpec:
    indices = spec.indices(train_roles)
    if not indices:
        raise ValueError(f"round {name!r}: the model has no trainable variables with roles "
                         f"{list(train_roles)}")
    return rounds.RoundSpec(name, (client_training.Phase(indices, 1),), **kwargs)


@dataclasses.dataclass(frozen=True)
class SchedulePlan:
    """An algorithm before composition: its model, round kinds, schedule and client/server
    configuration (`build_schedule` composes it; `tffl.algorithms.lora_ranks` adds a client hook)."""

    model: FederatedModel
    round_specs: tuple[rounds.RoundSpec, ...]
    schedule: Any
    client: ClientConfig
    aggregator: Any
    server_optimizer: Any


@dataclasses.dataclass(frozen=True)
class Rounds:
    """An algorithm on a model: its round kinds, its schedule, the variables the server holds
    beyond those the rounds train (FLoRA's base kernels, as indices of the model's non-trainable
    and trainable variables), and its own server optimizer (a `tff.learning.optimizers`
    optimizer; None: `FederatedLoraConfig.server_optimizer`'s)."""

    specs: tuple[rounds.RoundSpec, ...]
    schedule: Callable[[int], str]
    federated_non_trainable: tuple[int, ...] = ()
    federated_trainable: tuple[int, ...] = ()
    server_optimizer: Any = None


def _fedavg_lora(spec, extra_roles, **_) -> Rounds:
    """Clients train A, B (+ extra); the server averages each: A ← Ā, B ← B̄."""
    return Rounds((_round(spec, "ab_round", (roles.LORA_A, roles.LORA_B, *extra_roles)),),
                  schedules.constant("ab_round"))


def _ffa_lora(spec, extra_roles, **_) -> Rounds:
    """A stays at its initial value (never travels); clients train B (+ extra); B ← B̄."""
    return Rounds((_round(spec, "b_round", (roles.LORA_B, *extra_roles)),),
                  schedules.constant("b_round"))


def _rolora(spec, extra_roles, **_) -> Rounds:
    """A B round (A frozen) then an A round (B frozen), alternating from B."""
    return Rounds((_round(spec, "b_round", (roles.LORA_B, *extra_roles)),
                   _round(spec, "a_round", (roles.LORA_A, *extra_roles))),
                  schedules.alternating("b_round", "a_round"))


def _rolora_ffa(spec, extra_roles, switch_round=None, **_) -> Rounds:
    """RoLoRA's B and A rounds alternating until communication round `switch_round`, then only
    B rounds: one switch round kind (`tffl.engine.switch_round`) choosing B or A in-graph."""
    if switch_round is None:
        raise ValueError("rolora_ffa needs switch_round: the communication round from which "
                         "only B rounds run")
    kinds = (_round(spec, "b_round", (roles.LORA_B, *extra_roles)),
             _round(spec, "a_round", (roles.LORA_A, *extra_roles)))
    return Rounds((SwitchRoundSpec("b_or_a_round", kinds, int(switch_round)),),
                  schedules.constant("b_or_a_round"))


def _flexlora(spec, extra_roles, **_) -> Rounds:
    """Clients train A, B and upload the factors; the server takes the rank-r SVD of
    Σ p_i A_iB_i."""
    return Rounds((_round(spec, "ab_round", (roles.LORA_A, roles.LORA_B, *extra_roles),
                          upload="factors", server_step="svd", pairs=tuple(lora_pairs(spec))),),
                  schedules.constant("ab_round"))


def _flora(spec, extra_roles, seed=0, **_) -> Rounds:
    """Clients train A, B from (fresh A, B = 0) and upload the factors; the server merges
    Σ p_i A_iB_i into the linked base kernels (federated, so broadcast) and restarts A, B."""
    links = _flora_links(spec)
    round_spec = _round(spec, "ab_round", (roles.LORA_A, roles.LORA_B, *extra_roles),
                        upload="factors", server_step="merge", links=links, seed=int(seed),
                        pairs=tuple((link.a_index, link.b_index) for link in links))
    return Rounds((round_spec,), schedules.constant("ab_round"),
                  federated_non_trainable=tuple(
                      link.base_index for link in links if not link.base_trainable),
                  federated_trainable=tuple(
                      link.base_index for link in links if link.base_trainable))


def fedavg_lora_momentum(spec, extra_roles, momentum: float = 0.9, **_) -> Rounds:
    """FedAvg-LoRA with server momentum: clients train A, B (+ extra) as in `fedavg_lora`; the
    server keeps a momentum buffer m of the clients' mean uploads Δ̄ and steps every factor,

        m ← β·m − Δ̄,   w ← w − m          (`build_sgdm(1.0, momentum=β)` on the gradient −Δ̄).

    Written as a new algorithm's builder is: what the clients train (roles), a schedule, and a
    `tff.learning.optimizers` server optimizer; `tffl.algorithms.lora_fl.build_schedule` builds
    its process. Two rounds equal momentum SGD on the mean uploads, which numpy forms here from
    FedAvg-LoRA's one-client rounds (the same client updates, stepped by SGD with η_s = 1):

    >>> from tffl.algorithms import lora_fl
    >>> config = FederatedLoraConfig(ModelSource(model_fn, input_spec), client_optimizer=0.1)
    >>> process = lora_fl.build_schedule(fedavg_lora_momentum, config)       # β = 0.9
    >>> fedavg = lora_fl.build_schedule("fedavg_lora", config)
    >>> def mean_upload(w):      # Δ̄ = mean_i Δ_i from w (both clients hold 6 examples)
    ...     def upload(dataset):
    ...         start = fedavg.set_model_weights(fedavg.initialize(), w)
    ...         after = fedavg.get_model_weights(fedavg.next_round(start, [dataset]).state)
    ...         return [a - b for a, b in zip(after.trainable, w.trainable)]
    ...     return [np.mean(d, axis=0) for d in zip(*map(upload, client_datasets))]
    >>> with runtime.local_runtime():
    ...     state = process.initialize()
    ...     w = process.get_model_weights(state).trainable
    ...     m = [np.zeros_like(w_k) for w_k in w]                             # m starts at 0
    ...     for t in range(2):
    ...         mean = mean_upload(process.get_model_weights(state))
    ...         m = [0.9 * m_k - d for m_k, d in zip(m, mean)]                # β·m − Δ̄
    ...         w = [w_k - m_k for w_k, m_k in zip(w, m)]                     # w − m
    ...         state = process.next_round(state, client_datasets).state
    >>> all(np.allclose(got, want, atol=1e-6) for got, want in
    ...     zip(state.global_model_weights.trainable, w))
    True
    >>> buffer = state.finalizer["steps"]["ab_round"]["accumulator"]          # the server's m
    >>> all(np.allclose(got, want, atol=1e-6) for got, want in zip(buffer, m))
    True
    """
    kind = _round(spec, "ab_round", (roles.LORA_A, roles.LORA_B, *extra_roles))
    return Rounds((kind,), schedules.constant("ab_round"),
                  server_optimizer=tff.learning.optimizers.build_sgdm(1.0, momentum=momentum))


# Every federated-LoRA algorithm: its round kinds and schedule on a model.
ROUND_BUILDERS: dict[str, Callable[..., Rounds]] = {
    "rolora": _rolora, "fedavg_lora": _fedavg_lora, "ffa_lora": _ffa_lora,
    "flexlora": _flexlora, "flora": _flora, "rolora_ffa": _rolora_ffa,
}
# The ones with a fixed schedule (RoLoRA→FFA also needs its switch round).
FIXED_SCHEDULE_ALGORITHMS = tuple(name for name in ROUND_BUILDERS if name != "rolora_ffa")


def plan_schedule(algorithm, config: FederatedLoraConfig) -> SchedulePlan:
    """`algorithm`'s plan on `config`'s model, before its rounds are built and composed:
    `algorithm` is a name of `ROUND_BUILDERS`, or a round builder itself (`(spec, extra_roles,
    **options) -> Rounds`, as those are; e.g. `fedavg_lora_momentum`).

    Raises:
      ValueError: an unknown algorithm; a model without `lora_a`/`lora_b` variables, or with a
        trainable variable no round trains; a client step that is not a finite number > 0; a
        server optimizer both in the builder's `Rounds` and in `config`.
    """
    optimizer = client_training.as_optimizer(config.client_optimizer)
    extra_roles = tuple(config.extra_roles)
    if not callable(algorithm) and algorithm not in ROUND_BUILDERS:
        raise ValueError(f"unknown LoRA algorithm {algorithm!r}; expected one of "
                         f"{', '.join(ROUND_BUILDERS)}")
    builder = algorithm if callable(algorithm) else ROUND_BUILDERS[algorithm]
    spec = _inspect(config.model, extra_roles)
    switch = config.switch_round() if algorithm == "rolora_ffa" else None
    kinds = builder(spec, extra_roles, seed=int(config.seed), switch_round=switch)
    if kinds.server_optimizer is not None and config.server_optimizer is not None:
        raise ValueError(f"{algorithm_name(algorithm)} brings its own server optimizer; "
                         "FederatedLoraConfig.server_optimizer must stay None")
    federated = {k for s in kinds.specs for p in s.phases for k in p.train_indices}
    _check_all_trained(spec, federated, algorithm_name(algorithm), extra_roles)
    federated |= set(kinds.federated_trainable)
    model = build_federated_model(config.model, sorted(federated),
                                  kinds.federated_non_trainable, spec=spec)
    client = ClientConfig(optimizer, config.weight_decay, jit_compile=config.jit_compile)
    return SchedulePlan(model, tuple(kinds.specs), kinds.schedule, client, config.aggregator,
                        kinds.server_optimizer or config.server_optimizer)


def algorithm_name(algorithm) -> str:
    """The name of `algorithm` (a name, or a round builder: its function's name)."""
    if isinstance(algorithm, str):
        return algorithm
    return getattr(algorithm, "__name__", None) or algorithm.func.__name__   # or a partial


def _check_all_trained(spec, trained, algorithm, extra_roles) -> None:
    """A trainable variable that no round trains would silently keep its initial value (e.g. an
    untagged classifier head, which is `shared` by default): an error naming it. LoRA factors an
    algorithm keeps fixed by design (FFA-LoRA's A) are not."""
    idle = [v for k, v in enumerate(spec.trainable) if k not in trained
            and v.role not in (roles.LORA_A, roles.LORA_B)]
    if idle:
        names = ", ".join(f"{v.name} (role {v.role}"
                          + (", untagged)" if v.role == roles.SHARED else ")") for v in idle)
        raise ValueError(
            f"{names}: trainable, but no round of {algorithm} trains it (extra_roles="
            f"{list(extra_roles)}). Tag it with tffl.engine.roles.tag / tag_layer as "
            f"{' or '.join(repr(r) for r in (roles.HEAD, roles.SHARED, roles.SHORTCUT))} and "
            "pass that role in extra_roles to train and average it, or make it non-trainable "
            "to keep it frozen")


def _flora_links(spec):
    linked = {link.a_index for link in spec.links}
    unlinked = [spec.trainable[i].name for i in spec.indices([roles.LORA_A]) if i not in linked]
    if unlinked:
        raise ValueError(
            "FLoRA merges each adapter into its frozen base kernel, so every lora_a must be "
            "linked to one with tffl.engine.roles.link_lora (models.lora_layers does this); "
            f"unlinked: {', '.join(unlinked)}")
    return tuple(spec.links)
