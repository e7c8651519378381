"""Personal heads on role-tagged Keras models: FedRep, FedPer, LG-FedAvg, FedAvg(-FT), FLUTE,
AdaptPFL; and FedSA-LoRA's personal B factors.

Roles (`tffl.engine.roles`): the variables tagged `head` (and, for AdaptPFL, `shortcut`) are *personal*
(they never leave the client); the trainable `shared`, `lora_a` and `lora_b` variables are the
*representation* φ, averaged by the server; `frozen` variables are never trained. Client i's model
is f(x; φ, h_i).

| algorithm   | local phases (η: SGD step, E: epochs = passes over the round's data) | aggregated |
|-------------|------------------------------------------------------------------------|-----------|
| `fedrep`    | h_i: τ_h epochs with φ fixed, then φ: τ_r epochs with h_i fixed        | φ         |
| `fedper`    | (h_i, φ) jointly for E epochs                                           | φ         |
| `lg_fedavg` | (h_i, φ) jointly for E epochs; the model's lower layers carry `head`   | φ (top)   |
| `fedavg`    | (h, φ) jointly for E epochs from the global model                       | h and φ   |
| `fedavg_ft` | as `fedavg`; at evaluation each client first fine-tunes h for E_ft     | h and φ   |
| `flute`     | h_i: τ_h epochs, then (h_i, φ) τ_r epochs, regularized; NC step on H_i | φ         |
| `adaptpfl`  | h_i: τ_w, shortcut s_i: τ_s, then φ: τ_b epochs (B: `tffl.algorithms.adaptpfl`)    | φ         |
| `fedsa_lora`| (A, B_i, head) jointly for E epochs; every `lora_b` is personal         | A, head   |

(FedAvg trains every `head` and representation variable, so it also runs on untagged models.
FLUTE's regularizers are described at `FluteConfig`; AdaptPFL's mix (1−α)·f + α·s_i(x) is part of
the model, `models.paper_models.ShortcutMix`, so α = 0 is FedRep exactly.)

FedSA-LoRA (Guo et al., ICLR 2025, "Selective Aggregation for Low-Rank Adaptation in Federated
Learning") is FedPer's schedule on another split: both LoRA factors train, but only the A factors
are shared and averaged; each client keeps its B factors (role `lora_b`) as personal state. Every
other trainable variable (the classifier head, `shared` layers) is averaged with A: the paper
keeps only B local. It needs a model with LoRA factors and no `head` role is required.

(srpfl.md §6.1–6.4.) LG-FedAvg is FedPer's schedule on the opposite split: its *lower* layers are
local, so they carry the personal role `head`, and its top layers are the shared representation
(`models.paper_models.build_mlp(split="lg")`). FedAvg keeps no personal state.

Every algorithm is a schedule of `tffl.engine.rounds` rounds, one `tffl.engine.process.Process`. One communication
round: the server broadcasts the federated weights φ (the aggregated variables only: the frozen
backbone stays in its file, `tffl.engine.frozen`); client i assembles its model from φ, the frozen weights
and its stored h_i, runs the phases (`tffl.engine.client_training.build_phased_loop`, the one training
loop, with a `tff.learning.optimizers` client optimizer), uploads the deltas of the aggregated
variables it trained, Δ_i = φ_i − φ, with its weight n_i and three float32 metric sums, and returns
its new h_i as personal state. The server applies φ ← φ + η_s·agg(Δ_i) (a `tff.learning.optimizers`
server optimizer; default SGD with η_s = `server_learning_rate`) with a `tff.aggregators`
factory (default `MeanFactory()`: Σ n_i Δ_i / Σ n_i; the
papers' splits have equal n_i, where it equals the simple 1/n mean of srpfl.md Alg. 1; pass
`UnweightedMeanFactory()` for 1/n always).

LoRA representation (`lora_schedule`): with "joint", A and B are trained and averaged together
(FedAvg-LoRA-style); with "alternating", communication rounds alternate RoLoRA-style (one per `next`):
a B round (φ-phase trains B, A fixed; B averaged) then an A round (φ-phase trains A; A averaged),
each with its own head phase; both rounds upload half the factors, and the averages are exact
(see `tffl.algorithms.lora_fl`).

Stateful clients (`tffl.engine.personal_state`): for the algorithms with personal variables the process
follows the stateful-clients template,

    next: (state@S, data@C, personal@C) -> PersonalizedOutput(state@S, personal@C, metrics@S)

where client i's personal state is the list of its personal variables' values (in
`model.trainable_variables` order; FLUTE appends its class indicator u_i) and
`initialize_personal(client_id)` is the model's initial head. FedAvg and FedAvg-FT have no
personal state: they are ordinary `tff.learning.templates.LearningProcess`es (the same
`Process` with `personal=None`).

Evaluation (`evaluate`, a federated computation): each client starts from the global weights with
its stored h_i (algorithm-faithful: srpfl.md §8.2; the official code instead fine-tunes from the
averaged head), optionally fine-tunes h for `finetune_epochs` epochs on its training data (φ fixed),
and tests on its own test data. Reported: example-weighted `loss` and `accuracy` over all clients'
test examples, and `mean_client_accuracy`, the unweighted mean of the clients' accuracies.

Bytes per client per communication round (`traffic`): down = the broadcast federated weights, up =
the uploaded deltas plus the 4-byte weight and 12 metric bytes — read off the types; the personal
state is not traffic (it stays on the device).

Options and builders (`tffl.algorithms.personalized_builders`): `build_personalized_process` takes its options
as keywords or as one `PersonalizedConfig` (each field documented there with its default);
`BUILDERS[algorithm]` turns the model's variables by role into the algorithm's plan: its rounds
(`tffl.engine.rounds.RoundSpec`s per `lora_schedule`) and schedule, personal variables and hook. The process
receives its evaluation when it is built (`tffl.engine.process.Evaluation`: the evaluation
computation and FLUTE's final fine-tuning round); `process.evaluate(state, train, test,
personal_states)` runs it.

Example:

>>> process = build_personalized_process("fedrep", model_fn, input_spec, 0.05,
...                                      head_epochs=10, representation_epochs=1)
>>> from tffl.engine import personal_state
>>> store = personal_state.PersonalStore(process.initialize_personal)
>>> with runtime.local_runtime():
...     state = process.initialize()
...     out = process.next(state, datasets, store.lookup(client_ids))
...     store.update(client_ids, out.personal_states)
>>> [w.shape for w in store.lookup(["a"])[0]]     # client a's head h_a: kernel and bias
[(8, 3), (3,)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import tensorflow as tf
import tensorflow_federated as tff

from tffl.algorithms.personalized_builders import BUILDERS, PersonalizedConfig, Plan, Split
from tffl.engine import client_training
from tffl.engine import model_spec
from tffl.engine import rounds
from tffl.engine import process as process_lib
from tffl.engine.client_hooks import ClientConfig
from tffl.engine.federated_evaluation import build_evaluation
from tffl.engine.federated_model import ModelSource, build_federated_model, personal_spec

PERSONALIZED_ALGORITHMS = tuple(BUILDERS)
assert PERSONALIZED_ALGORITHMS == ("fedrep", "fedper", "lg_fedavg", "fedavg", "fedavg_ft",
                                   "flute", "adaptpfl", "fedsa_lora")
# What every client uploads besides its deltas: loss sum, correct, examples and its weight n_i.
METRIC_UPLOAD_BYTES = rounds.METRIC_UPLOAD_BYTES + rounds.WEIGHT_UPLOAD_BYTES
# `ModelSource`'s fields that `build_personalized_process` takes as keyword options.
_MODEL_OPTIONS = tuple(f.name for f in dataclasses.fields(ModelSource)
                       if f.name not in ("model_fn", "input_spec"))


def build_personalized(algorithm: str, config: PersonalizedConfig) -> process_lib.Process:
    """FedRep, FedPer, LG-FedAvg, FedAvg, FedAvg-FT, FLUTE, AdaptPFL or FedSA-LoRA (module
    docstring) on `config.model`, with `config.client_optimizer` (its fields documented at
    `PersonalizedConfig`). The model's personal variables carry the role `head` and its
    representation `shared` / `lora_a` / `lora_b`.

    Raises:
      ValueError: unknown algorithm or schedule; an epoch count ≤ 0; a client step that is not
        a finite number > 0; a split that leaves the personal (`head`) or the representation
        role empty; "alternating" without LoRA; no model or client optimizer in `config`.
    """
    if algorithm not in PERSONALIZED_ALGORITHMS:
        raise ValueError(f"unknown personalized algorithm {algorithm!r}; expected one of "
                         f"{', '.join(PERSONALIZED_ALGORITHMS)}")
    if config.model is None or config.client_optimizer is None:
        raise ValueError(f"{algorithm} needs PersonalizedConfig(model=ModelSource(...), "
                         "client_optimizer=<SGD step or tff.learning.optimizers optimizer>)")
    config = config.resolved(algorithm)
    spec = config.model.spec()
    plan = BUILDERS[algorithm](algorithm, Split.of(spec), config, config.model.input_spec)
    return _build_process(algorithm, config, spec, plan)


def build_personalized_process(
    algorithm: str,
    keras_model_fn: Callable[[], tf.keras.Model],
    input_spec,
    client_optimizer,
    *,
    config: PersonalizedConfig | None = None,
    **options,
) -> process_lib.Process:
    """`build_personalized` on a Keras model function and the clients' input spec.

    Args:
      algorithm: one of `PERSONALIZED_ALGORITHMS`.
      keras_model_fn: no-arg function returning a fresh Keras model whose personal variables carry
        the role `head` and whose representation carries `shared` / `lora_a` / `lora_b`.
      input_spec: element spec `(x, y)` of a client's batched dataset.
      client_optimizer: local SGD step η > 0, or a `tff.learning.optimizers.Optimizer`.
      config: the options as a `PersonalizedConfig` (its fields and defaults are documented
        there); or pass them as keywords instead, not both.
      **options: the fields of `PersonalizedConfig`, and of the model's `ModelSource`
        (`loss_fn`, `initial_trainable`, `initial_non_trainable`, `frozen_dir`,
        `client_device`).

    Raises:
      TypeError: both `config` and keyword options, or an unknown option.
      ValueError: as `build_personalized`.
    """
    if config is not None and options:
        raise TypeError(f"pass the options either as config= or as keywords, not both (got "
                        f"config and {', '.join(sorted(options))})")
    model_options = {k: options.pop(k) for k in _MODEL_OPTIONS if k in options}
    config = PersonalizedConfig(**options) if config is None else config
    return build_personalized(algorithm, dataclasses.replace(
        config, model=ModelSource(keras_model_fn, input_spec, **model_options),
        client_optimizer=client_optimizer))


def _build_process(algorithm: str, config: PersonalizedConfig, spec: model_spec.ModelSpec,
                   plan: Plan) -> process_lib.Process:
    """The engine's rounds, the evaluation computations and the process for `plan`: the
    federated weights are the variables some round trains, minus the personal ones."""
    trained = {k for s in plan.round_specs for p in s.phases for k in p.train_indices}
    federated = sorted(trained - set(plan.personal))
    model = build_federated_model(config.model, federated, personal=plan.personal, spec=spec)
    client = ClientConfig(client_training.as_optimizer(config.client_optimizer),
                          config.weight_decay, plan.hook, config.jit_compile)
    server_optimizer = config.server_optimizer or tff.learning.optimizers.build_sgdm(
        float(config.server_learning_rate))
    pieces = [rounds.build_round(model, s, client, config.aggregator, server_optimizer)
              for s in plan.round_specs]
    finetune = ([client_training.Phase(plan.head, config.finetune_epochs)]
                if config.finetune_epochs else [])
    final = None
    if config.flute is not None and config.flute.final_head_epochs:
        final = build_evaluation(
            model, client, [client_training.Phase(plan.head, config.flute.final_head_epochs)],
            plan.hook, finetune_objective=True)
    evaluation = process_lib.Evaluation(
        build_evaluation(model, client, finetune, plan.hook), final_computation=final,
        personal_indices=tuple(plan.personal), finetune_epochs=config.finetune_epochs)
    return process_lib.build_process(
        algorithm, pieces, process_lib.Federated(model.initial_weights(), model.data_type(),
                                                 personal_spec(model, plan.hook)),
        plan.schedule, process_lib.ProcessSupport(model=model, hook=plan.hook,
                                                  evaluation=evaluation, config=config))


def personal_state_type(process) -> tff.Type:
    """TFF type of one client's personal state of `process` (its personal variables, and for
    FLUTE its float32 class indicator)."""
    return process.personal.type


__all__ = ["METRIC_UPLOAD_BYTES", "PERSONALIZED_ALGORITHMS", "build_personalized",
           "build_personalized_process", "personal_state_type"]
