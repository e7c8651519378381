"""Algorithm names -> tffl processes, optimizers, participation samplers and evaluators.

`build_algorithm("rolora", task, ...)` is what `--algorithm=rolora` (with the optimizer and
schedule flags) becomes, for a `tasks.registry.RunTask`; `build_sampler` is `--participation`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tasks.registry import RunTask
from tffl.algorithms import registry
from tffl.simulation import evaluation
from tffl.simulation import participation
from tffl.algorithms import personalized
from tffl.simulation import srpfl


# The Keras-model algorithms of the one list (`tffl.algorithms.registry.ALGORITHMS`; its `linear`
# family runs in the synthetic experiments, not in train.py).
ALGORITHMS = tuple(n for n, a in registry.ALGORITHMS.items() if a.family != "linear")
LORA_ALGORITHMS = tuple(n for n, a in registry.ALGORITHMS.items() if a.family == "lora")
PERSONALIZED_ALGORITHMS = tuple(
    n for n, a in registry.ALGORITHMS.items() if a.family == "personalized")
# The representation of the personalized algorithms: a whole MLP, or LoRA adapters averaged
# jointly (FedAvg-LoRA-style) or alternately (RoLoRA-style: a B round, then an A round).
REPRESENTATIONS = ("mlp", "lora", "lora_alternating")
PARTICIPATIONS = ("uniform", "full", "srpfl")
STRAGGLER_MODELS = ("fixed", "dynamic")


def model_for(algorithm: str, representation: str = "mlp") -> str:
    """The model an algorithm trains: LoRA algorithms need role-tagged LoRA factors; the
    personalized ones a `head` (LG-FedAvg: local lower layers) and a representation."""
    if algorithm == "flora":
        return "lora_net_base"
    if algorithm in LORA_ALGORITHMS or algorithm == "fedsa_lora":
        return "lora_net"  # FedSA-LoRA: the LoRA methods' net, its B factors personal
    if algorithm == "adaptpfl":
        if representation != "mlp":
            raise ValueError("adaptpfl's shortcut model has an MLP representation; use "
                             "--representation=mlp")
        return "pfl_mlp_shortcut"
    if representation != "mlp":
        return "lora_head_net"
    return "pfl_mlp_lg" if algorithm == "lg_fedavg" else "pfl_mlp"


OPTIMIZERS = ("sgd", "sgdm", "adam")


def build_optimizer(name: str, learning_rate: float, momentum: float = 0.0):
    """A `tff.learning.optimizers` optimizer: `sgd` (with `momentum` > 0: SGD with momentum),
    `sgdm` (SGD with momentum; `momentum` must be > 0, e.g. 0.5 as SRPFL's and FLUTE's code) or
    `adam` (β = 0.9, 0.999; `momentum` must be 0)."""
    import tensorflow_federated as tff

    if not (np.isfinite(learning_rate) and learning_rate > 0):
        raise ValueError(f"learning rate {learning_rate} must be > 0")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum {momentum} must be in [0, 1)")
    if name == "sgdm" and not momentum > 0:
        raise ValueError("the sgdm optimizer needs a momentum > 0 (e.g. 0.5, SRPFL's code)")
    if name in ("sgd", "sgdm"):
        return tff.learning.optimizers.build_sgdm(learning_rate, momentum=momentum or None)
    if name == "adam":
        if momentum:
            raise ValueError("momentum applies to the sgd optimizer only (adam has its own betas)")
        return tff.learning.optimizers.build_adam(learning_rate)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


def build_algorithm(
    name: str,
    task: RunTask,
    client_learning_rate,
    server_learning_rate: float = 1.0,
    communication_rounds: int = 1,
    rolora_fraction: float = 0.5,
    representation: str = "mlp",
    local_epochs: int = 1,
    head_epochs: int | None = 1,
    representation_epochs: int = 1,
    representation_blocks: int = 1,
    finetune_epochs: int | None = None,
    shortcut_epochs: int = 1,
    flute: personalized.FluteConfig | None = None,
    adaptpfl: personalized.AdaptPflConfig | None = None,
    server_optimizer=None,
    weight_decay: float = 0.0,
    frozen_dir=None,
    client_ranks=None,
    averaging_error: bool = True,
    initial_weights=None,
):
    """The process of algorithm `name` on `task`'s model. `client_learning_rate` is an SGD step
    or a `tff.learning.optimizers` optimizer; `server_optimizer` (default SGD with
    `server_learning_rate`) applies the mean delta. The task's pretrained frozen weights, if
    any, go into the process's frozen-weights file (they never enter the server state).
    `client_ranks` (flexlora, flora): `{client id: rank}` (`tffl.algorithms.lora_ranks`).
    `averaging_error` (fedavg_lora): log ‖mean(A_i)·mean(B_i) − mean(A_iB_i)‖_F /
    ‖mean(A_iB_i) − A·B‖_F per round (`finalizer/averaging_error`, a simulation-only diagnostic
    whose extra aggregation is not counted in the bytes; `tffl.algorithms.lora_fl`).
    `initial_weights`: `(trainable, non_trainable)` the model starts from instead of its own
    draw and the task's pretrained weights (e.g. `models.peft_export.initial_weights_with_adapters`)."""
    import tensorflow_federated as tff

    server_optimizer = server_optimizer or tff.learning.optimizers.build_sgdm(
        float(server_learning_rate))
    pretrained = task.pretrained_non_trainable() if task.pretrained_non_trainable else None
    model = dict(initial_non_trainable=pretrained, frozen_dir=frozen_dir)
    if initial_weights is not None:
        model.update(initial_trainable=initial_weights[0], initial_non_trainable=initial_weights[1])
    entry = registry.get(name)
    if entry.family == "personalized":
        config = dict(
            local_epochs=local_epochs, head_epochs=head_epochs,
            representation_epochs=representation_epochs, finetune_epochs=finetune_epochs,
            representation_blocks=representation_blocks,
            shortcut_epochs=shortcut_epochs, flute=flute if name == "flute" else None,
            adaptpfl=adaptpfl if name == "adaptpfl" else None,
            lora_schedule="alternating" if representation == "lora_alternating" else "joint",
            server_optimizer=server_optimizer, weight_decay=weight_decay)
    else:
        config = registry.LoraConfig(
            server_optimizer=server_optimizer, weight_decay=weight_decay,
            rolora_fraction=rolora_fraction, total_rounds=communication_rounds,
            client_ranks=client_ranks,
            averaging_error=(name == "fedavg_lora" and averaging_error
                             and client_ranks is None))
    return entry.build(task.keras_model_fn, task.input_spec, client_learning_rate, config,
                       **model)


def build_sampler(task: RunTask, clients_per_round: int, seed: int, kind: str = "uniform",
                  initial_participants: int = 1, stage_rounds: int | str = 10,
                  straggler: str = "fixed", communication_cost: float = 0.0,
                  pool: int | None = None):
    """`uniform`: `clients_per_round` clients drawn per round; `full`: every client every round,
    with the simulated wall-clock of the straggler model (FedRep's baseline clock); `srpfl`: of
    all clients, the fastest n take part, n0 = `initial_participants` doubling after each stage
    of `stage_rounds` rounds (an int or "lemma_b1"). `pool`: N of the clients drawn at random
    each round first (srpfl and full; default all)."""
    if kind == "uniform":
        return participation.UniformSampler(task.client_ids, clients_per_round, seed)
    if straggler not in STRAGGLER_MODELS:
        raise ValueError(f"unknown straggler model {straggler!r}; choose one of "
                         f"{', '.join(STRAGGLER_MODELS)}")
    times = (srpfl.FixedExponentialTimes() if straggler == "fixed"
             else srpfl.DynamicExponentialTimes())
    if kind == "full":
        return srpfl.FullParticipationClock(task.client_ids, seed, times, communication_cost,
                                            pool=pool)
    if kind == "srpfl":
        return srpfl.SrpflSampler(task.client_ids, initial_participants, seed, times,
                                  stage_rounds=stage_rounds, communication_cost=communication_cost,
                                  pool=pool)
    raise ValueError(f"unknown participation {kind!r}; choose one of {', '.join(PARTICIPATIONS)}")


def _personal_metrics(process, state, store, data, prefix: str) -> dict[str, float]:
    """`process.evaluate` of every client in `data` = (ids, train, test) with its own state,
    keyed `<prefix><metric>`."""
    ids, train, test = data
    personal = store.lookup(ids) if store is not None else None
    metrics = process.evaluate(state, train, test, personal)
    return {f"{prefix}{k}": v for k, v in metrics.items() if k != "num_examples"}


def _personal_heldout(task: RunTask, process, state, store) -> dict[str, float]:
    """`personal_test_*`: every client's own model on its shard of the task's held-out split
    (`RunTask.client_heldout_data`, e.g. SST-2's labeled test split), none without one."""
    heldout = getattr(task, "client_heldout_data", None)
    if heldout is None:
        return {}
    return _personal_metrics(process, state, store, heldout(), "personal_test_")


def personalized_evaluator(task: RunTask, process) -> Callable[..., dict[str, float]]:
    """The `evaluate_fn` of `tffl.simulation.driver.run_rounds` for a process of
    `PERSONALIZED_ALGORITHMS`: every client with test data evaluated on its own test set
    (`personal_*`; with its stored personal state, or after fine-tuning for FedAvg-FT), and on
    its shard of the held-out split when the task has one (`personal_test_*`), plus the global
    model on the pooled test set (`loss`, `accuracy`) for FedAvg and FedAvg-FT, whose global
    model is the whole model."""

    def evaluate(state, store=None) -> dict[str, float]:
        out = _personal_metrics(process, state, store, task.client_eval_data(), "personal_")
        out.update(_personal_heldout(task, process, state, store))
        if store is None:
            out.update(task.evaluate(process.model_weights(state)))
        return out

    return evaluate


def _pooled(per_client: list[dict[str, float]]) -> dict[str, float]:
    """Example-weighted loss and accuracy, and the unweighted mean client accuracy, of clients'
    evaluations `{"loss", "accuracy", "num_examples"}` (what one evaluation over all of them
    gives)."""
    n = np.array([m["num_examples"] for m in per_client], np.float64)
    total = max(n.sum(), 1.0)
    return {"loss": float(np.dot(n, [m["loss"] for m in per_client]) / total),
            "accuracy": float(np.dot(n, [m["accuracy"] for m in per_client]) / total),
            "mean_client_accuracy": float(np.mean([m["accuracy"] for m in per_client])),
            "num_examples": float(n.sum())}


def per_client_evaluator(task: RunTask, process, personalized: bool
                         ) -> Callable[..., dict[str, float]]:
    """--eval_per_client's `evaluate_fn`: `(state, store=None) -> {"<client id>_accuracy": …}`
    for every client with test data (the review domains: per-domain accuracy), and the pooled
    metrics the run reports without it, from the same one pass over each client's test set:

    - personalized: each client with its own stored personal state (FedAvg-FT: after
      fine-tuning); `personal_loss` and `personal_accuracy` = Σ_i n_i·m_i / Σ_i n_i and
      `personal_mean_client_accuracy` = mean_i accuracy_i, which is what
      `personalized_evaluator`'s one evaluation over all clients returns, with its
      `personal_test_*` on a held-out split. FedAvg and FedAvg-FT add their global model's
      pooled `loss` and `accuracy` (`task.evaluate`);
    - global: the global model on each client's test set; `loss` and `accuracy` pooled the same
      way when the clients' test sets add up to the pooled test set (`task.global_test_size`:
      they partition it), else `task.evaluate`'s second pass."""

    evaluators = {}

    def evaluate(state, store=None) -> dict[str, float]:
        ids, train, test = task.client_eval_data()
        per_client = []
        if personalized:
            personal = store.lookup(ids) if store is not None else None
            for i in range(len(ids)):
                per_client.append(process.evaluate(
                    state, [train[i]], [test[i]], None if personal is None else [personal[i]]))
        else:
            weights = process.model_weights(state)
            for cid, data in zip(ids, test):
                if cid not in evaluators:
                    evaluators[cid] = evaluation.make_keras_evaluator(
                        task.keras_model_fn, data, with_count=True)
                per_client.append(evaluators[cid](weights))
        out = {f"{cid}_accuracy": m["accuracy"] for cid, m in zip(ids, per_client)}
        pooled = _pooled(per_client)
        if personalized:
            out.update({f"personal_{k}": v for k, v in pooled.items() if k != "num_examples"})
            out.update(_personal_heldout(task, process, state, store))
            if store is None:
                out.update(task.evaluate(process.model_weights(state)))
        elif getattr(task, "global_test_size", None) == round(pooled["num_examples"]):
            out.update(loss=pooled["loss"], accuracy=pooled["accuracy"])
        else:
            out.update(task.evaluate(process.model_weights(state)))
        return out

    return evaluate
