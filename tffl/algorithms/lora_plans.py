"""Federated LoRA algorithms before composition: the model's LoRA factors, each algorithm's
round kinds and schedule (`plan_schedule`), shared by `tffl.algorithms.lora_fl` (equal ranks) and
`tffl.algorithms.lora_ranks` (per-client ranks), which compose them.

| algorithm    | round kinds (roles trained; upload; server step)            | schedule          |
|--------------|-------------------------------------------------------------|-------------------|
| `fedavg_lora`| `ab_round`: A, B, extra; deltas; optimizer                  | constant          |
| `ffa_lora`   | `b_round`: B, extra; deltas; optimizer                      | constant          |
| `rolora`     | `b_round`, `a_round`: B or A, extra; deltas; optimizer      | B, A, B, A, ...   |
| `rolora_ffa` | `b_or_a_round`: B or A by round number, as RoLoRA then B     | constant          |
| `flexlora`   | `ab_round`: A, B, extra; factors; SVD of Σ p_i A_iB_i       | constant          |
| `flora`      | `ab_round`: A, B, extra; factors; merge into W0, fresh A    | constant          |

>>> [pair for pair in lora_pairs(spec)]        # (index of A, index of B) in spec.trainable
[(0, 1)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tffl.engine import client_training
from tffl.engine import rounds as engine
from tffl.engine import roles
from tffl.engine import schedules
from tffl.engine import switch_round as switching



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


def _inspect(keras_model_fn, input_spec, extra_roles) -> client_training.ModelSpec:
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
            f"'{roles.LORA_A}' and '{roles.LORA_B}' (tffl.engine.roles.tag); trainable variables: {names}"
        )
    lora_pairs(spec)  # validates the factor shapes
    return spec


def _round(spec, name, train_roles, **kwargs) -> engine.RoundSpec:
    indices = spec.indices(train_roles)
    if not indices:
        raise ValueError(f"round {name!r}: the model has no trainable variables with roles "
                         f"{list(train_roles)}")
    return engine.RoundSpec(name, (client_training.Phase(indices, 1),), **kwargs)


@dataclasses.dataclass(frozen=True)
class SchedulePlan:
    """An algorithm before composition: its model, round kinds, schedule and client/server
    configuration (`build_schedule` composes it; `tffl.algorithms.lora_ranks` adds a client hook)."""

    model: engine.FederatedModel
    round_specs: tuple[engine.RoundSpec, ...]
    schedule: Any
    client: engine.ClientConfig
    aggregator: Any
    server_optimizer: Any


@dataclasses.dataclass(frozen=True)
class Rounds:
    """An algorithm on a model: its round kinds, its schedule, and the variables the server
    holds beyond those the rounds train (FLoRA's base kernels, as indices of the model's
    non-trainable and trainable variables)."""

    specs: tuple[engine.RoundSpec, ...]
    schedule: Callable[[int], str]
    federated_non_trainable: tuple[int, ...] = ()
    federated_trainable: tuple[int, ...] = ()


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
    return Rounds((switching.SwitchRoundSpec("b_or_a_round", kinds, int(switch_round)),),
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


# Every federated-LoRA algorithm: its round kinds and schedule on a model.
ROUND_BUILDERS: dict[str, Callable[..., Rounds]] = {
    "rolora": _rolora, "fedavg_lora": _fedavg_lora, "ffa_lora": _ffa_lora,
    "flexlora": _flexlora, "flora": _flora, "rolora_ffa": _rolora_ffa,
}
# The ones with a fixed schedule (RoLoRA→FFA also needs its switch round).
ALGORITHMS = tuple(name for name in ROUND_BUILDERS if name != "rolora_ffa")


def plan_schedule(algorithm: str, keras_model_fn, input_spec, client_learning_rate,
                  loss_fn=None, aggregator=None, extra_roles=(roles.HEAD,), client_device=None,
                  server_optimizer=None, weight_decay: float = 0.0, initial_non_trainable=None,
                  frozen_dir=None, seed: int = 0, switch_round: int | None = None,
                  initial_trainable=None, jit_compile: bool = False) -> SchedulePlan:
    """`build_schedule`'s plan (same arguments) before its rounds are built and composed."""
    try:
        client_training.as_optimizer(client_learning_rate)
    except ValueError:
        raise ValueError(f"client_learning_rate={client_learning_rate} must be a finite number "
                         "> 0 (or a tff.learning.optimizers.Optimizer)") from None
    extra_roles = tuple(extra_roles)
    if algorithm not in ROUND_BUILDERS:
        raise ValueError(f"unknown LoRA algorithm {algorithm!r}; expected one of "
                         f"{', '.join(ROUND_BUILDERS)}")
    spec = _inspect(keras_model_fn, input_spec, extra_roles)
    rounds = ROUND_BUILDERS[algorithm](spec, extra_roles, seed=int(seed),
                                       switch_round=switch_round)
    specs, schedule, federated_nt = rounds.specs, rounds.schedule, rounds.federated_non_trainable
    federated = {k for s in specs for p in s.phases for k in p.train_indices}
    _check_all_trained(spec, federated, algorithm, extra_roles)
    federated |= set(rounds.federated_trainable)
    model = engine.build_federated_model(
        keras_model_fn, input_spec, sorted(federated), federated_nt,
        initial_non_trainable=initial_non_trainable, frozen_dir=frozen_dir, loss_fn=loss_fn,
        client_device=client_device, spec=spec, initial_trainable=initial_trainable)
    client = engine.ClientConfig(client_learning_rate, weight_decay, jit_compile=jit_compile)
    return SchedulePlan(model, tuple(specs), schedule, client, aggregator, server_optimizer)


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
