"""Personal heads on role-tagged Keras models: FedRep, FedPer, LG-FedAvg, FedAvg(-FT), FLUTE,
AdaptPFL; and FedSA-LoRA's personal B factors.

Roles (`tffl.roles`): the variables tagged `head` (and, for AdaptPFL, `shortcut`) are *personal*
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
| `adaptpfl`  | h_i: τ_w, shortcut s_i: τ_s, then φ: τ_b epochs (B: `tffl.adaptpfl`)    | φ         |
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

Every algorithm is a schedule of `tffl.engine` rounds (`tffl.processes`). One communication
round: the server broadcasts the federated weights φ (the aggregated variables only: the frozen
backbone stays in its file, `tffl.frozen`); client i assembles its model from φ, the frozen weights
and its stored h_i, runs the phases (`tffl.client_training.build_phased_loop`, the one training
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
(see `tffl.lora_fl`).

Stateful clients (`tffl.personal_state`): for the algorithms with personal variables the process
follows the stateful-clients template,

    next: (state@S, data@C, personal@C) -> PersonalizedOutput(state@S, personal@C, metrics@S)

where client i's personal state is the list of its personal variables' values (in
`model.trainable_variables` order; FLUTE appends its class indicator u_i) and
`initialize_personal(client_id)` is the model's initial head. FedAvg and FedAvg-FT have no
personal state: they are ordinary `tff.learning.templates.LearningProcess`es.

Evaluation (`evaluate`, a federated computation): each client starts from the global weights with
its stored h_i (algorithm-faithful: srpfl.md §8.2; the official code instead fine-tunes from the
averaged head), optionally fine-tunes h for `finetune_epochs` epochs on its training data (φ fixed),
and tests on its own test data. Reported: example-weighted `loss` and `accuracy` over all clients'
test examples, and `mean_client_accuracy`, the unweighted mean of the clients' accuracies.

Bytes per client per communication round (`traffic`): down = the broadcast federated weights, up =
the uploaded deltas plus the 4-byte weight and 12 metric bytes — read off the types; the personal
state is not traffic (it stays on the device).

Example:

>>> process = build_personalized_process("fedrep", model_fn, input_spec, 0.05,
...                                      head_epochs=10, representation_epochs=1)
>>> from tffl import personal_state
>>> store = personal_state.PersonalStore(process.initialize_personal)
>>> with runtime.local_runtime():
...     state = process.initialize()
...     out = process.next(state, datasets, store.lookup(client_ids))
...     store.update(client_ids, out.personal_states)
>>> [w.shape for w in store.lookup(["a"])[0]]     # client a's head h_a: kernel and bias
[(8, 3), (3,)]
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl import adaptpfl as adaptpfl_phases
from tffl import client_training
from tffl import engine
from tffl import lora_fl
from tffl import processes
from tffl import roles
from tffl.adaptpfl import AdaptPflConfig  # noqa: F401  (public here)
from tffl.flute import FluteConfig, FluteHook, neural_collapse  # noqa: F401  (public here)

ALGORITHMS = ("fedrep", "fedper", "lg_fedavg", "fedavg", "fedavg_ft", "flute", "adaptpfl",
              "fedsa_lora")
LORA_SCHEDULES = ("joint", "alternating")
REPRESENTATION_ROLES = (roles.SHARED, roles.LORA_A, roles.LORA_B)
PERSONAL_ROLES = (roles.HEAD,)
# What every client uploads besides its deltas: loss sum, correct, examples and its weight n_i.
METRIC_UPLOAD_BYTES = engine.METRIC_UPLOAD_BYTES + engine.WEIGHT_UPLOAD_BYTES


def _check_same_length(train_data, test_data):
    if len(train_data) != len(test_data):
        raise ValueError(f"{len(train_data)} training but {len(test_data)} test datasets: "
                         "evaluation needs both for every client, in the same order")


def _floats(metrics) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()}


class PersonalizationProcess(processes.ScheduledProcess):
    """FedAvg and FedAvg-FT (no personal state): a `LearningProcess` with `evaluate`."""

    def evaluate(self, state, train_data, test_data) -> dict[str, float]:
        """Per-client test metrics (FedAvg-FT fine-tunes the head first) over the clients whose
        train/test datasets are given."""
        _check_same_length(train_data, test_data)
        return _floats(self.evaluate_computation(
            self.get_model_weights(state), train_data, test_data))


class PersonalizedProcess(processes.PersonalizedProcess):
    """FedRep, FedPer, LG-FedAvg, FLUTE and AdaptPFL: the stateful-clients protocol with
    `evaluate(state, personal_states, train, test)`."""

    def evaluate(self, state, personal_states, train_data, test_data) -> dict[str, float]:
        """Personalized test metrics: client i uses its `personal_states[i]`."""
        self.check_personal(train_data, personal_states)
        _check_same_length(train_data, test_data)
        return _floats(self.evaluate_computation(
            self.get_model_weights(state), list(personal_states), train_data, test_data))

    def evaluate_final(self, state, personal_states, train_data, test_data) -> dict[str, float]:
        """FLUTE's final round (`FluteConfig.final_head_epochs` > 0): every given client
        fine-tunes its head on its training data with the FLUTE objective, then is tested as in
        `evaluate`; neither the state nor the personal states change."""
        if getattr(self, "final_evaluate_computation", None) is None:
            raise ValueError(f"{self.algorithm} has no final head fine-tuning round (FLUTE's "
                             "final_head_epochs > 0 builds one)")
        self.check_personal(train_data, personal_states)
        _check_same_length(train_data, test_data)
        return _floats(self.final_evaluate_computation(
            self.get_model_weights(state), list(personal_states), train_data, test_data))


def _check_epochs(name: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise ValueError(f"{name}={value} must be an integer >= {minimum}")
    return int(value)


def build_personalized_process(
    algorithm: str,
    keras_model_fn: Callable[[], tf.keras.Model],
    input_spec,
    client_learning_rate,
    *,
    local_epochs: int = 1,
    head_epochs: int | None = None,
    representation_epochs: int = 1,
    shortcut_epochs: int = 1,
    representation_blocks: int = 1,
    finetune_epochs: int | None = None,
    flute: FluteConfig | None = None,
    adaptpfl: AdaptPflConfig | None = None,
    lora_schedule: str = "joint",
    loss_fn: Callable[[], client_training.LossFn] | None = None,
    aggregator=None,
    server_learning_rate: float = 1.0,
    server_optimizer=None,
    weight_decay: float = 0.0,
    initial_non_trainable=None,
    frozen_dir=None,
    client_device: str | None = None,
    initial_trainable=None,
    jit_compile: bool = False,
) -> PersonalizationProcess | PersonalizedProcess:
    """Builds FedRep, FedPer, LG-FedAvg, FedAvg, FedAvg-FT, FLUTE or AdaptPFL (module docstring).

    Args:
      algorithm: one of `ALGORITHMS`.
      keras_model_fn: no-arg function returning a fresh Keras model whose personal variables carry
        the role `head` and whose representation carries `shared` / `lora_a` / `lora_b`.
      input_spec: element spec `(x, y)` of a client's batched dataset.
      client_learning_rate: local SGD step η > 0, or a `tff.learning.optimizers.Optimizer`.
      local_epochs: E ≥ 1, epochs of joint training (FedPer, LG-FedAvg, FedAvg, FedAvg-FT,
        FedSA-LoRA, plain FLUTE).
      head_epochs: τ_h ≥ 1, FedRep's (FLUTE*'s, AdaptPFL's τ_w) head epochs per round (default
        1); plain FLUTE has no head-only epochs and refuses it.
      representation_epochs: τ_r ≥ 1, FedRep's (FLUTE's, AdaptPFL's τ_b) representation epochs
        per round.
      shortcut_epochs: τ_s ≥ 1, AdaptPFL's shortcut epochs (between the head and the
        representation phases).
      representation_blocks: R ≥ 1, FedRep's (head τ_h, representation τ_r) blocks per round,
        interleaved: R = 5 is SRPFL's code on CIFAR-100/EMNIST/FEMNIST (`local_rep_ep`), 5 × (10
        head epochs + 1 representation epoch); default 1 (FedRep's paper).
      finetune_epochs: E_ft ≥ 0, head fine-tuning epochs before evaluation (default 10 for
        `fedavg_ft`, as in srpfl.md §6.4; 0 otherwise; `fedavg` must keep 0).
      flute: FLUTE's regularizers (default `FluteConfig()`, the official code's values); only for
        `algorithm="flute"`.
      adaptpfl: AdaptPFL's variant and ablation switches (default `AdaptPflConfig()`, variant
        A; `tffl.adaptpfl`); only for `algorithm="adaptpfl"`.
      lora_schedule: "joint" or "alternating" (RoLoRA-style B then A rounds; needs LoRA factors).
      loss_fn: no-arg function returning `(y_true, y_pred) -> scalar` (default: sparse
        categorical cross-entropy on logits).
      aggregator: a `tff.aggregators` factory for the deltas (default `MeanFactory()`).
      server_learning_rate: η_s > 0 of the default server optimizer, φ ← φ + η_s·agg(Δ_i).
      server_optimizer: a `tff.learning.optimizers.Optimizer` instead of SGD with η_s.
      weight_decay: λ ≥ 0, the clients' coupled L2 (g + λθ).
      initial_non_trainable, initial_trainable, frozen_dir, client_device, jit_compile: as
        `tffl.lora_fl.build_schedule`.

    Raises:
      ValueError: unknown algorithm or schedule; an epoch count ≤ 0; η ≤ 0; a split that leaves
        the personal (`head`) or the representation role empty; "alternating" without LoRA.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown personalized algorithm {algorithm!r}; expected one of "
                         f"{', '.join(ALGORITHMS)}")
    if lora_schedule not in LORA_SCHEDULES:
        raise ValueError(f"lora_schedule={lora_schedule!r} must be one of "
                         f"{', '.join(LORA_SCHEDULES)}")
    if not isinstance(client_learning_rate, tff.learning.optimizers.Optimizer) and not (
            np.isfinite(client_learning_rate) and client_learning_rate > 0):
        raise ValueError(f"client_learning_rate={client_learning_rate} must be a finite number "
                         "> 0")
    if not (np.isfinite(server_learning_rate) and server_learning_rate > 0):
        raise ValueError(f"server_learning_rate={server_learning_rate} must be a finite number "
                         "> 0")
    local_epochs = _check_epochs("local_epochs", local_epochs)
    if algorithm == "flute" and flute is not None and flute.variant == "plain" and (
            head_epochs is not None):
        raise ValueError(f"head_epochs={head_epochs}: plain FLUTE (the paper's Algorithm 2) has "
                         "no head-only epochs; use local_epochs, or variant='star' (FLUTE*)")
    head_epochs = _check_epochs("head_epochs (τ_h)", 1 if head_epochs is None else head_epochs)
    representation_epochs = _check_epochs("representation_epochs (τ_r)", representation_epochs)
    shortcut_epochs = _check_epochs("shortcut_epochs (τ_s)", shortcut_epochs)
    representation_blocks = _check_epochs("representation_blocks", representation_blocks)
    if representation_blocks > 1 and algorithm != "fedrep":
        raise ValueError(f"representation_blocks={representation_blocks} interleaves FedRep's "
                         f"head and representation epochs; it does not apply to {algorithm!r}")
    if flute is not None and algorithm != "flute":
        raise ValueError(f"flute regularizers were given for algorithm {algorithm!r}; they "
                         "apply only to 'flute'")
    if algorithm == "flute" and flute is None:
        flute = FluteConfig()
    if adaptpfl is not None and algorithm != "adaptpfl":
        raise ValueError(f"an AdaptPflConfig was given for algorithm {algorithm!r}; it applies "
                         "only to 'adaptpfl'")
    if algorithm == "adaptpfl" and adaptpfl is None:
        adaptpfl = AdaptPflConfig()
    if finetune_epochs is None:
        finetune_epochs = 10 if algorithm == "fedavg_ft" else 0
    finetune_epochs = _check_epochs("finetune_epochs", finetune_epochs, minimum=0)
    if algorithm == "fedavg" and finetune_epochs:
        raise ValueError("fedavg evaluates the global model as it is; for head fine-tuning "
                         "before evaluation use fedavg_ft")

    spec = client_training.inspect_model(keras_model_fn, input_spec)
    head = spec.indices(PERSONAL_ROLES)
    shortcut = spec.indices([roles.SHORTCUT])
    representation = spec.indices(REPRESENTATION_ROLES)
    layout = ", ".join(f"{v.name}:{v.role}" for v in spec.trainable) or "none"
    if algorithm == "fedsa_lora":
        a_idx, b_idx = spec.indices([roles.LORA_A]), spec.indices([roles.LORA_B])
        if not a_idx or not b_idx:
            raise ValueError(
                "fedsa_lora shares the LoRA A factors and keeps the B factors personal, but the "
                f"model has no trainable lora_a/lora_b variables (use a LoRA model, e.g. "
                f"--representation=lora). Trainable variables: {layout}")
        if lora_schedule != "joint":
            raise ValueError("fedsa_lora trains A and B together (lora_schedule='joint'); "
                             "alternating rounds would leave the personal B untrained half the time")
        # The head (if any) is averaged with A; B is the personal state.
        representation = tuple(sorted(set(representation + head) - set(b_idx)))
        head = b_idx
    if not head and algorithm != "fedavg":
        raise ValueError(
            f"{algorithm} needs personal variables (role {roles.HEAD!r}: the head, or "
            f"LG-FedAvg's local layers) but the model has none; tag them with "
            f"tffl.roles.tag_layer(layer, {roles.HEAD!r}). Trainable variables: {layout}")
    if not representation and algorithm != "fedavg":
        raise ValueError(
            f"{algorithm} needs a representation to aggregate (trainable variables with roles "
            f"{', '.join(REPRESENTATION_ROLES)}) but the model has none. Trainable variables: "
            f"{layout}")
    if not head + representation:
        raise ValueError(f"{algorithm}: the model has no trainable variables to train")
    if algorithm == "adaptpfl" and not shortcut:
        raise ValueError(
            f"adaptpfl needs a personal shortcut (variables with role {roles.SHORTCUT!r}), but "
            "the model has none: build it with a shortcut branch, e.g. "
            f"models.paper_models.build_mlp(shortcut_alpha=α). Trainable variables: {layout}")
    personal = () if algorithm in ("fedavg", "fedavg_ft") else head
    if algorithm == "adaptpfl":
        personal = tuple(sorted(head + shortcut))
    hook = _flute_hook(spec, head, flute, input_spec) if algorithm == "flute" else None

    def phases_for(rep: tuple[int, ...]) -> tuple[client_training.Phase, ...]:
        if algorithm == "flute" and flute.variant == "plain":
            # The paper's Algorithm 2: H, b and B trained jointly from the same point.
            return (client_training.Phase(tuple(sorted(head + rep)), local_epochs),)
        if algorithm in ("fedrep", "flute"):
            # FLUTE* as the official code runs it: head-only epochs, then joint epochs.
            second = rep if algorithm == "fedrep" else tuple(sorted(head + rep))
            return (client_training.Phase(head, head_epochs),
                    client_training.Phase(second, representation_epochs)) * representation_blocks
        if algorithm == "adaptpfl":
            return adaptpfl_phases.phases(adaptpfl, spec, head, shortcut, rep, head_epochs,
                                          shortcut_epochs, representation_epochs)
        return (client_training.Phase(tuple(sorted(head + rep)), local_epochs),)

    if lora_schedule == "alternating":
        a_idx, b_idx = spec.indices([roles.LORA_A]), spec.indices([roles.LORA_B])
        if not a_idx or not b_idx:
            raise ValueError("lora_schedule='alternating' alternates the LoRA factors, but the "
                             f"model has no trainable lora_a/lora_b variables: {layout}")
        lora_fl.lora_pairs(spec)
        others = tuple(k for k in representation if k not in a_idx + b_idx)
        rep_sets = {"b_round": tuple(sorted(others + b_idx)),
                    "a_round": tuple(sorted(others + a_idx))}
        schedule = processes.alternating("b_round", "a_round")
    else:
        rep_sets = {"round": representation}
        schedule = processes.constant("round")
    round_specs = [engine.RoundSpec(name, phases_for(rep)) for name, rep in rep_sets.items()]
    trained = {k for s in round_specs for p in s.phases for k in p.train_indices}
    federated = sorted(trained - set(personal))
    model = engine.build_federated_model(
        keras_model_fn, input_spec, federated, personal=personal,
        initial_non_trainable=initial_non_trainable, frozen_dir=frozen_dir, loss_fn=loss_fn,
        client_device=client_device, spec=spec, initial_trainable=initial_trainable)
    client = engine.ClientConfig(client_learning_rate, weight_decay, hook, jit_compile)
    server_optimizer = server_optimizer or tff.learning.optimizers.build_sgdm(
        float(server_learning_rate))
    pieces = [engine.build_round(model, s, client, aggregator, server_optimizer)
              for s in round_specs]
    stateful = bool(personal) or hook is not None
    initialize, rounds = processes.compose_rounds(model, pieces, personal=stateful, hook=hook)
    if stateful:
        process = PersonalizedProcess(algorithm, model, pieces, initialize, rounds, schedule,
                                      hook)
    else:
        process = PersonalizationProcess(algorithm, model, pieces, initialize, rounds, schedule)
    finetune = [client_training.Phase(head, finetune_epochs)] if finetune_epochs else []
    process.evaluate_computation = engine.build_evaluation(model, client, finetune, hook)
    process.final_evaluate_computation = None
    if flute is not None and flute.final_head_epochs:
        process.final_evaluate_computation = engine.build_evaluation(
            model, client, [client_training.Phase(head, flute.final_head_epochs)], hook,
            finetune_objective=True)
    process.personal_indices = tuple(personal)
    process.finetune_epochs = finetune_epochs
    return process


def _flute_hook(spec, head, flute: FluteConfig, input_spec) -> FluteHook:
    kernels = [k for k in head if len(spec.trainable[k].shape) == 2]
    if len(kernels) != 1:
        raise ValueError(f"flute needs exactly one head kernel H (k×m), found "
                         f"{[spec.trainable[k].name for k in kernels]}")
    kernel_index = kernels[0]
    num_classes = spec.trainable[kernel_index].shape[1]
    if num_classes < 2:
        raise ValueError(f"flute's neural-collapse term needs m >= 2 classes, the head "
                         f"kernel {spec.trainable[kernel_index].name} has {num_classes}")
    y_spec = client_training.split_batch(input_spec)[1]
    if not y_spec.dtype.is_integer:
        raise ValueError(f"flute needs integer class labels, got {y_spec.dtype.name}")
    return FluteHook(flute, kernel_index, num_classes, head)


def personal_state_type(process) -> tff.Type:
    """TFF type of one client's personal state of `process` (its personal variables, and for
    FLUTE its float32 class indicator)."""
    return engine.personal_type(process.model, getattr(process, "hook", None))


__all__ = ["ALGORITHMS", "AdaptPflConfig", "FluteConfig", "LORA_SCHEDULES", "METRIC_UPLOAD_BYTES",
           "PersonalizationProcess", "PersonalizedProcess", "build_personalized_process",
           "neural_collapse", "personal_state_type"]
