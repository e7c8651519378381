"""Algorithm names -> tffl processes, optimizers, participation samplers and evaluators.

`build_algorithm("rolora", task, config)` is what `--algorithm=rolora` (with the optimizer and
schedule flags of the `RunConfig`) becomes, for a `tasks.run_task.RunTask`; `build_sampler` is
`--participation`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from runner.run_config import ParticipationConfig
from runner.run_config import RunConfig
from tasks.run_task import RunTask
from tasks.run_task import counted
from tffl.algorithms import lora_ranks
from tffl.algorithms import registry
from tffl.algorithms.adaptpfl import AdaptPFLConfig
from tffl.algorithms.flute import FluteConfig
from tffl.algorithms.lora_plans import FederatedLoraConfig
from tffl.algorithms.personalized_builders import PersonalizedConfig
from tffl.engine.federated_model import ModelSource
from tffl.simulation import evaluation
from tffl.simulation import participation
from tffl.simulation import srpfl
from tffl.simulation import srpfl_schedule


# The Keras-model algorithms of the one list (`tffl.algorithms.registry.ALGORITHMS`; its `linear`
# family runs in the synthetic experiments, not in train.py).
KERAS_ALGORITHMS = tuple(n for n, a in registry.ALGORITHMS.items() if a.family != "linear")
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
    `sgdm` (SGD with momentum) or `adam` (β = 0.9, 0.999; `momentum` must be 0). The values
    come from a checked `RunConfig` (`runner.train_options.check`: a learning rate > 0, a
    momentum in [0, 1), > 0 for sgdm)."""
    import tensorflow_federated as tff

    if name in ("sgd", "sgdm"):
        return tff.learning.optimizers.build_sgdm(learning_rate, momentum=momentum or None)
    if name == "adam":
        if momentum:
            raise ValueError("momentum applies to the sgd optimizer only (adam has its own betas)")
        return tff.learning.optimizers.build_adam(learning_rate)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


def model_source(task: RunTask, frozen_dir=None, initial_weights=None) -> ModelSource:
    """`task`'s model as the algorithms take it: its function and input spec, starting from the
    task's pretrained frozen weights if it has any, or from `initial_weights`
    (`(trainable, non_trainable)`, e.g. `runner.training.initial_weights_with_adapters`);
    the frozen-weights file goes to `frozen_dir`."""
    pretrained = task.pretrained_non_trainable() if task.pretrained_non_trainable else None
    trainable, non_trainable = initial_weights or (None, pretrained)
    return ModelSource(task.keras_model_fn, task.input_spec, initial_trainable=trainable,
                       initial_non_trainable=non_trainable, frozen_dir=frozen_dir)


def adaptpfl_config(config: RunConfig) -> AdaptPFLConfig:
    """The `tffl.algorithms.adaptpfl.AdaptPFLConfig` of the run's AdaptPFL fields."""
    a = config.algorithm
    return AdaptPFLConfig(
        variant=a.adaptpfl_variant, order=a.adaptpfl_order, shortcut_ridge=a.shortcut_ridge,
        project_shortcut=a.project_shortcut, shortcut_damping=a.shortcut_damping,
        head_damping=a.head_damping)


def flute_config(config: RunConfig) -> FluteConfig:
    """The `tffl.algorithms.flute.FluteConfig` of the run's FLUTE fields."""
    a = config.algorithm
    return FluteConfig(
        feature_penalty=a.flute_feature_penalty, head_penalty=a.flute_head_penalty,
        nc_penalty=a.flute_nc_penalty, nc_step=a.flute_nc_step,
        feature_reduction=a.flute_feature_reduction, variant=a.flute_variant,
        final_head_epochs=a.flute_final_head_epochs)


def algorithm_config(name: str, source: ModelSource, client_ids, config: RunConfig):
    """The family configuration (`tffl.algorithms.registry.CONFIGS`) of algorithm `name` on the
    model `source`, from the run's algorithm and model sections: its client and server
    optimizers (`build_optimizer`), local work and the family's own options; `client_ids`
    (the task's clients) take `config.model.client_ranks` (`tffl.algorithms.lora_ranks`)."""
    a, m = config.algorithm, config.model
    client_optimizer = build_optimizer(a.client_optimizer, a.learning_rate, a.client_momentum)
    server_optimizer = build_optimizer(a.server_optimizer, a.server_learning_rate,
                                       a.server_momentum)
    if registry.get(name).family == "personalized":
        return PersonalizedConfig(
            local_epochs=a.local_epochs,
            head_epochs=(None if name == "flute" and a.flute_variant == "plain"
                         else a.head_epochs),
            representation_epochs=a.representation_epochs,
            representation_blocks=a.representation_blocks, finetune_epochs=a.finetune_epochs,
            shortcut_epochs=a.shortcut_epochs,
            flute=flute_config(config) if name == "flute" else None,
            adaptpfl=adaptpfl_config(config) if name == "adaptpfl" else None,
            lora_schedule="alternating" if m.representation == "lora_alternating" else "joint",
            server_optimizer=server_optimizer, weight_decay=a.weight_decay, model=source,
            client_optimizer=client_optimizer)
    client_ranks = (lora_ranks.assign_ranks(client_ids, list(m.client_ranks))
                    if m.client_ranks else None)
    return FederatedLoraConfig(
        source, client_optimizer, server_optimizer=server_optimizer,
        weight_decay=a.weight_decay, rolora_fraction=a.rolora_fraction, total_rounds=a.rounds,
        client_ranks=client_ranks,
        averaging_error=(name == "fedavg_lora" and a.averaging_error and client_ranks is None))


def build_algorithm(name: str, task: RunTask, config: RunConfig, initial_weights=None):
    """The process of algorithm `name` on `task`'s model, configured by `config`
    (`algorithm_config`; `initial_weights` as `model_source`). The task's pretrained frozen
    weights, if any, go into the process's frozen-weights file (they never enter the server
    state). `config.algorithm.averaging_error` (fedavg_lora): log
    ‖mean(A_i)·mean(B_i) − mean(A_iB_i)‖_F / ‖mean(A_iB_i) − A·B‖_F per round
    (`finalizer/averaging_error`, a simulation-only diagnostic whose extra aggregation is not
    counted in the bytes; `tffl.algorithms.lora_fl`)."""
    source = model_source(task, config.model.frozen_dir, initial_weights)
    return registry.get(name).build(algorithm_config(name, source, task.client_ids, config))


def build_sampler(task: RunTask, participation_config: ParticipationConfig, seed: int):
    """The sampler of `participation_config.participation`: `uniform`: `clients_per_round`
    clients drawn per round; `full`: every client every round, with the simulated wall-clock of
    the straggler model (FedRep's baseline clock); `srpfl`: of all clients, the fastest n take
    part, n0 = `initial_participants` doubling after each stage of `stage_rounds` rounds (an
    int or "lemma_b1"). `srpfl_pool`: N of the clients drawn at random each round first (srpfl
    and full; 0: all).

    Raises:
      ValueError: an unknown participation or straggler model, or more clients per round than
        the task has.
    """
    p = participation_config
    kind, straggler, pool = p.participation, p.straggler, p.srpfl_pool or None
    clients_per_round, communication_cost = p.clients_per_round, p.communication_cost
    if kind == "uniform" and clients_per_round > len(task.client_ids):
        raise ValueError(f"clients_per_round={clients_per_round}: the task has "
                         f"{counted(len(task.client_ids), 'client')}; pass at most that")
    if kind == "uniform":
        return participation.UniformSampler(task.client_ids, clients_per_round, seed)
    if straggler not in STRAGGLER_MODELS:
        raise ValueError(f"unknown straggler model {straggler!r}; choose one of "
                         f"{', '.join(STRAGGLER_MODELS)}")
    times = (srpfl_schedule.FixedExponentialTimes() if straggler == "fixed"
             else srpfl_schedule.DynamicExponentialTimes())
    if kind == "full":
        return srpfl.FullParticipationClock(task.client_ids, seed, times, communication_cost,
                                            pool=pool)
    if kind == "srpfl":
        return srpfl.SrpflSampler(task.client_ids, p.initial_participants, seed, times,
                                  stage_rounds=p.stage_rounds,
                                  communication_cost=communication_cost, pool=pool)
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
