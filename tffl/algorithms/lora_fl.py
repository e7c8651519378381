"""Federated LoRA as schedules on the one engine: FedAvg-LoRA, FFA-LoRA, RoLoRA, RoLoRA→FFA,
FlexLoRA and FLoRA.

Notation (`shared/specs/rolora.md` §1): an adapted matrix is W = W0 + A·B (times the layer's α/r),
A ∈ R^{d_in×r} (role `lora_a`), B ∈ R^{r×d_out} (role `lora_b`, zero at init). Client i has n_i
examples; "mean" is what the `tff.aggregators` factory computes (default `MeanFactory()`:
Σ_i n_i·v_i / Σ_i n_i; `UnweightedMeanFactory()` gives the paper's 1/N). Clients upload deltas
v_i = θ_i − θ; the server applies them with a `tff.learning.optimizers` server optimizer (default
SGD with η_s = 1, so θ + mean(v_i) = mean(θ_i)).

Every algorithm is a set of round kinds (`tffl.engine.rounds.RoundSpec`: which roles clients train,
what they upload, which server step) and a schedule over them (`tffl.engine.process.Process`); every
communication round trains on its own client data.

| algorithm      | round kinds (trained; uploaded)                    | schedule (t = rounds done) |
|----------------|----------------------------------------------------|----------------------------|
| `fedavg_lora`  | `ab_round`: A, B (+ `extra_roles`); A ← Ā, B ← B̄ | always                     |
| `ffa_lora`     | `b_round`: B (+ extra); A stays at its init        | always                     |
| `rolora`       | `b_round`: B (+ extra); `a_round`: A (+ extra)     | B if t even, else A        |
| `rolora_ffa`   | `b_or_a_round`: RoLoRA's B or A round, in-graph    | A if t odd and t < x·T, else B |
| `flexlora`     | `ab_round`: A_i, B_i; SVD of Σ p_i A_iB_i          | always                     |
| `flora`        | `ab_round`: A_i, B_i (from B = 0); merged into W0 | always                     |

RoLoRA's exactness: in a B round every client holds the same A, so mean_i(A·B_i) = A·mean_i(B_i);
in an A round every client holds the same B̄, so mean_i(A_i·B̄) = mean_i(A_i)·B̄. FedAvg-LoRA's
mean_i(A_i)·mean_i(B_i) differs from mean_i(A_i·B_i) in general; `averaging_error=True`
measures it each round (`build_schedule`). RoLoRA starts with the B round (B = 0 at init makes
∇_A ℓ = 0).

FlexLoRA (Bai et al. 2024): clients upload their factors A_i, B_i (r·(d_in + d_out) values per
adapted matrix, as FLoRA's); the stacking aggregation (below) gives the server
P = Σ_i p_i A_iB_i (= A·B + mean_i(A_iB_i − A·B), the paper's product average), and the server
splits its rank-r truncated SVD P ≈ U_r S_r V_rᵀ into A = U_r S_r^{1/2}, B = S_r^{1/2} V_rᵀ.

FLoRA (Wang et al. 2024): every round starts from a fresh adapter (A random, B = 0); clients
upload A_i, B_i; the aggregation (`tffl.engine.factor_aggregation.stacking_aggregation`) stacks them,
[p_1A_1 … p_NA_N]·[B_1; …; B_N] = Σ_i p_i·A_i·B_i (a `tff.federated_aggregate` accumulating
p_i·A_i·B_i, so the upload stays r·(d_in + d_out)); the server merges
W0 ← W0 + scale·Σ_i p_i A_iB_i into the frozen kernel linked to the adapter
(`tffl.engine.roles.link_lora`) and restarts it: A ← `flora_a_init(seed, t)`, B ← 0. Those kernels are
therefore federated (broadcast and counted in the bytes down).

What travels: the server state, the broadcast and checkpoints hold only the federated variables
(the factors the schedule trains, the `extra_roles` variables, FLoRA's base kernels); the frozen
backbone and never-trained variables (FFA-LoRA's A) stay in the model's base-weights file
(`tffl.engine.frozen`). `process.model_weights(state)` gives the whole model.

Build the processes before creating any eager Keras model in the same program: tracing them
builds Keras models in graphs, which invalidates Keras 2 models created eagerly before.
Datasets with dict elements must yield `OrderedDict`s or dicts with sorted keys (a TFF rule).

TFF's contract: every process here is a `tff.learning.templates.LearningProcess` whose `next` is
a `tff.Computation` with TFF's metric structure, so `tff.learning.programs.train_model` runs it.
For RoLoRA `next` is one RoLoRA iteration, the B round then the A round, each on its own client
data: `next(state, {<b_round=D*, a_round=D*>}@CLIENTS)` (`process.data_names`; metrics
`client_work/train` over both rounds, `finalizer/round_kind` = [b_round, a_round]).
`next_round(state, datasets)` runs one communication round (what `tffl.simulation.driver` calls).
RoLoRA→FFA switches once, so it has no periodic `next`: its `next` is `next_round`.

Example:

>>> process = build_lora_process("rolora", model_fn, input_spec, client_optimizer=0.1)
>>> with runtime.local_runtime():
...     state = process.initialize()
...     state = process.next_round(state, client_datasets).state   # a B round
...     state = process.next_round(state, other_datasets).state    # an A round, on fresh batches
...     both = process.next(state, [{"b_round": b, "a_round": a}   # one iteration: B then A
...                                 for b, a in zip(client_datasets, other_datasets)]).state
...     weights = process.model_weights(both)
"""

from __future__ import annotations

import dataclasses

from tffl.algorithms import lora_plans
from tffl.algorithms import lora_ranks
from tffl.engine import communication
from tffl.engine import composition
from tffl.engine import process as process_lib
from tffl.engine import rounds
from tffl.engine.federated_model import ModelSource

# What every client uploads besides its update: float32 loss sum, correct and example counts,
# and the float32 weight n_i of the aggregation.
METRIC_UPLOAD_BYTES = rounds.METRIC_UPLOAD_BYTES + rounds.WEIGHT_UPLOAD_BYTES
# `ModelSource`'s fields besides the model function and input spec: the keyword options of the
# builders below that describe the model rather than its federation.
_MODEL_OPTIONS = tuple(f.name for f in dataclasses.fields(ModelSource)
                       if f.name not in ("model_fn", "input_spec"))


def build_schedule(algorithm, config: lora_plans.FederatedLoraConfig) -> process_lib.Process:
    """The process of `algorithm` (one of `lora_plans.FIXED_SCHEDULE_ALGORITHMS`, "rolora_ffa",
    which needs `config.total_rounds`, or a round builder, `lora_plans.plan_schedule`'s) on
    `config`'s model (`tffl.algorithms.lora_plans.FederatedLoraConfig`).

    With `config.client_ranks` (flexlora, flora) the process is a personalized `Process` whose
    personal state is each client's rank (`tffl.algorithms.lora_ranks`).

    Raises:
      ValueError: the model has no `lora_a`/`lora_b` variables, the client step is not > 0,
        or `averaging_error` for another algorithm.
    """
    if config.averaging_error and algorithm != "fedavg_lora":
        raise ValueError(f"averaging_error is FedAvg-LoRA's measurement (fedavg_lora), not "
                         f"{algorithm!r}'s: one factor a round (RoLoRA, FFA-LoRA) makes it 0, "
                         "and FlexLoRA and FLoRA aggregate the products themselves")
    if config.client_ranks is not None:
        return lora_ranks.build_heterogeneous_rank_process(algorithm, config)
    plan = lora_plans.plan_schedule(algorithm, config)
    model = plan.model
    pieces = [rounds.build_round(model, s, plan.client, plan.aggregator, plan.server_optimizer)
              for s in plan.round_specs]
    federated = process_lib.Federated(model.initial_weights(), model.data_type())
    traffic_rounds = None
    if config.averaging_error:
        plain, pairs = pieces, lora_plans.lora_pairs(model.spec)
        pieces = [rounds.with_averaging_error(model, s, p, pairs, plan.aggregator)
                  for s, p in zip(plan.round_specs, plain)]

        def traffic_rounds():   # the algorithm's own rounds: what `traffic` sizes
            return composition.compose_kinds(plain, federated.initial_weights,
                                             federated.data_type)[1]
    return process_lib.build_process(
        lora_plans.algorithm_name(algorithm), pieces, federated, plan.schedule,
        process_lib.ProcessSupport(model=model, traffic_rounds=traffic_rounds))


def lora_config(keras_model_fn, input_spec, client_optimizer, **options
                ) -> lora_plans.FederatedLoraConfig:
    """A `FederatedLoraConfig` from keyword options: those of `ModelSource` (`loss_fn`,
    `initial_trainable`, `initial_non_trainable`, `frozen_dir`, `client_device`) go to its
    model, the others are `FederatedLoraConfig`'s fields.

    >>> config = lora_config(model_fn, input_spec, 0.1, frozen_dir="/tmp/f", seed=3)
    >>> config.model.frozen_dir, config.seed, config.client_optimizer
    ('/tmp/f', 3, 0.1)
    """
    model = {k: options.pop(k) for k in _MODEL_OPTIONS if k in options}
    return lora_plans.FederatedLoraConfig(ModelSource(keras_model_fn, input_spec, **model),
                                 client_optimizer, **options)


def build_lora_process(name: str, keras_model_fn, input_spec, client_optimizer, **options
                       ) -> process_lib.Process:
    """The process of algorithm `name` (one of `lora_plans.FIXED_SCHEDULE_ALGORITHMS`) on a Keras
    model: `client_optimizer` a local SGD step η > 0 or a `tff.learning.optimizers.Optimizer`,
    `options` as `lora_config` takes them.

    Raises:
      ValueError: for an unknown name (and as `build_schedule`).
    """
    if name not in lora_plans.FIXED_SCHEDULE_ALGORITHMS:
        raise ValueError(f"unknown LoRA algorithm {name!r}; expected one of "
                         f"{', '.join(lora_plans.FIXED_SCHEDULE_ALGORITHMS)}")
    return build_schedule(name, lora_config(keras_model_fn, input_spec, client_optimizer,
                                            **options))


def build_fedavg_lora(keras_model_fn, input_spec, client_optimizer, **options):
    """FedAvg-LoRA (FedIT): clients train A and B; the server sets A ← mean A_i, B ← mean B_i.
    Options as `lora_config` (`averaging_error=True`: also measure
    ‖Ā·B̄ − mean(A_iB_i)‖_F / ‖mean(A_iB_i) − A·B‖_F each round)."""
    return build_lora_process("fedavg_lora", keras_model_fn, input_spec, client_optimizer,
                              **options)


def build_ffa_lora(keras_model_fn, input_spec, client_optimizer, **options):
    """FFA-LoRA: A stays at its (common) initial value and never travels; clients train B;
    B ← mean B_i. Options as `lora_config`."""
    return build_lora_process("ffa_lora", keras_model_fn, input_spec, client_optimizer,
                              **options)


def build_rolora(keras_model_fn, input_spec, client_optimizer, **options):
    """RoLoRA: communication rounds alternate a B round (A frozen, B ← mean B_i) and an A round
    (B frozen, A ← mean A_i), starting with B; each round kind has its own aggregator and
    server-optimizer state. Options as `lora_config`."""
    return build_lora_process("rolora", keras_model_fn, input_spec, client_optimizer, **options)


def build_flexlora(keras_model_fn, input_spec, client_optimizer, **options):
    """FlexLoRA: clients train A and B and upload A_i, B_i; the stacking aggregation gives
    P = Σ_i p_i A_iB_i and the server sets A = U_r S_r^{1/2}, B = S_r^{1/2} V_rᵀ from P's rank-r
    truncated SVD. `aggregator` sets p_i (weighted: n_i/Σn, unweighted: 1/N) and aggregates the
    `extra_roles` deltas. Options as `lora_config`."""
    return build_lora_process("flexlora", keras_model_fn, input_spec, client_optimizer,
                              **options)


def build_flora(keras_model_fn, input_spec, client_optimizer, **options):
    """FLoRA: clients train A, B from (A, B = 0) and upload A_i, B_i; the server merges
    W0 ← W0 + scale·Σ_i p_i·A_i·B_i (stacking) and restarts the adapter (A ← `flora_a_init` with
    `seed` and the round number, B ← 0). Every `lora_a` must be linked to its frozen kernel
    (`tffl.engine.roles.link_lora`); `aggregator` sets p_i (weighted: n_i/Σn, unweighted: 1/N) and
    aggregates the `extra_roles` deltas. Options as `lora_config`."""
    return build_lora_process("flora", keras_model_fn, input_spec, client_optimizer, **options)


def build_rolora_then_ffa(rolora_fraction: float, total_communication_rounds: int,
                          keras_model_fn, input_spec, client_optimizer, **options
                          ) -> process_lib.Process:
    """"x% RoLoRA + (100−x)% FFA-LoRA" (`rolora.md` §1.3 (ii)): RoLoRA's alternation for the
    first round(x·T) communication rounds, then only B rounds (x = `rolora_fraction`,
    T = `total_communication_rounds`); options as `lora_config`.

    Raises:
      ValueError: x outside [0, 1] or T < 1 (and as `build_rolora`).
    """
    return build_schedule("rolora_ffa", lora_config(
        keras_model_fn, input_spec, client_optimizer, rolora_fraction=rolora_fraction,
        total_rounds=total_communication_rounds, **options))


def upload_bytes_per_communication_round(process) -> dict[str, int]:
    """Bytes one client uploads in each round kind, from the types: the update (trained
    factors' deltas, or FlexLoRA's and FLoRA's factors, + `extra_roles` deltas), its float32
    weight and the three metric sums."""
    return {name: traffic.up for name, traffic in process.traffic.items()}


def traffic_per_communication_round(process) -> dict[str, communication.RoundTraffic]:
    """`{round kind: RoundTraffic}`: bytes down (the federated weights) and up per client."""
    return dict(process.traffic)


__all__ = [
    "METRIC_UPLOAD_BYTES", "build_fedavg_lora", "build_ffa_lora", "build_flexlora",
    "build_flora", "build_lora_process", "build_rolora", "build_rolora_then_ffa",
    "build_schedule", "lora_config", "traffic_per_communication_round",
    "upload_bytes_per_communication_round",
]
