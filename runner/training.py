"""One training run: a `RunConfig` -> task, algorithm, sampler -> the round driver
(`tffl.simulation.driver.run_rounds`) -> metrics, checkpoints and `summary.json`.

`run_algorithm(algorithm, output_dir, config)` runs one of `config.algorithm.algorithm`;
`runner.run.run(config)` runs them all inside a `tffl.runtime` context.
"""

from __future__ import annotations

import json
import pathlib
import re
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from runner import algorithms, machine
from runner.cli import UsageError
from runner.run_config import EVALUATION_FLAGS, RunConfig
from tasks import registry
from tasks.run_task import counted
from tasks.task_config import TaskSpec
from tffl.simulation.metrics_log import announce

# Fields that name a run's math; --resume refuses a checkpoint written with other values.
RUN_FLAGS = (
    "task", "partition", "classes_per_client", "dirichlet_alpha", "num_clients", "rank",
    "rolora_fraction", "clients_per_round", "local_steps", "batch_size",
    "learning_rate", "server_learning_rate", "seed", "representation", "local_epochs",
    "client_optimizer", "client_momentum", "weight_decay", "server_optimizer", "server_momentum",
    "head_epochs", "representation_epochs", "finetune_epochs", "participation",
    "shortcut_epochs", "shortcut_alpha", "flute_feature_penalty", "flute_head_penalty",
    "flute_nc_penalty", "flute_nc_step", "backbone", "sequence_length", "pooling", "head",
    "lora_targets",
    "lora_layers", "lora_alpha", "prefix_cache", "bucket_by_length",
    "initial_participants", "stage_rounds", "straggler", "communication_cost",
)
# Fields added later: they enter the run's identity only when not at their default, so that
# runs from before them still resume.
LATER_RUN_FLAGS = ("srpfl_pool", "flute_variant", "flute_feature_reduction",
                   "representation_blocks", "client_ranks", "flute_final_head_epochs",
                   "eval_test", "eval_per_client", "adaptpfl_variant", "adaptpfl_order",
                   "shortcut_ridge", "project_shortcut", "shortcut_damping", "head_damping",
                   "init_adapters", "train_file", "dev_file", "test_file", "tfds_name",
                   "tfds_splits", "text_column", "text_pair_column", "label_column",
                   "client_column", "prefix_cache_dtype", "base_dtype")


def run_identity(config: RunConfig, algorithm: str) -> dict[str, Any]:
    """The values that name `algorithm`'s run of `config` (as flag values: the form older
    checkpoints recorded); `--resume` refuses a checkpoint recorded with other ones.

    >>> from runner.run_config import EVALUATION_FLAGS, RunConfig
    >>> run_identity(RunConfig(), "rolora")["rank"], "srpfl_pool" in run_identity(RunConfig(), "rolora")
    (16, False)
    """
    values, default = config.flag_values(), RunConfig().flag_values()
    identity = {name: values[name] for name in RUN_FLAGS} | {"algorithm": algorithm}
    identity.update({n: values[n] for n in LATER_RUN_FLAGS if values[n] != default[n]})
    identity["rank"] = config.model.adapter_rank
    return identity


def _as_usage_error(error: ValueError, config: RunConfig) -> ValueError:
    """A library error that names a parameter first (`rank=65: ...`, `data_dir is needed: ...`)
    as the CLI's one line naming the flag that set it (`flag --rank=65: ...`); the adapters'
    rank set by --client_ranks names that flag. Other errors as they are."""
    message = str(error)
    param = re.match(r"[a-z_]+", message)
    if param is None or param.group() not in config.flag_values():
        return error
    param, rest = param.group(), message[param.end():]
    if param == "rank" and config.model.client_ranks and config.model.rank is None:
        ranks = ",".join(map(str, config.model.client_ranks))
        return UsageError(f"flag --client_ranks={ranks}: rank {rest.lstrip('=')}")
    return UsageError(f"flag --{param}{rest}" if rest.startswith("=") else
                      f"flag --{param}:{rest}")


def task_spec(algorithm: str, config: RunConfig) -> TaskSpec:
    """The `tasks.task_config.TaskSpec` of `algorithm`'s run of `config`: its task and model
    sections, and what the algorithm, runtime and output sections decide about the task."""
    return TaskSpec(
        task=config.task, model=config.model, local_steps=config.algorithm.local_steps,
        seed=config.algorithm.seed,
        net=algorithms.model_for(algorithm, config.model.representation),
        shortcut_alpha=config.algorithm.shortcut_alpha,
        # Workers at other addresses may not see this machine's files: send rounds in the call.
        rounds_on_disk=not config.runtime.worker_addresses,
        eval_test=config.output.eval_test)


def run_task_for(algorithm: str, config: RunConfig):
    """The `tasks.registry.RunTask` of `algorithm`'s run of `config` (`UsageError` naming the
    flag of a value the task refuses)."""
    try:
        return registry.build_run_task(task_spec(algorithm, config))
    except ValueError as e:
        raise _as_usage_error(e, config) from None


def participants(config: RunConfig) -> str:
    """Who trains each round, in words (the run's first line)."""
    p, num_clients = config.participation, config.task.num_clients
    pool = f"{p.srpfl_pool} random of {num_clients}" if p.srpfl_pool else f"{num_clients}"
    return {
        "uniform": f"{counted(p.clients_per_round, 'client')} per round",
        "full": (f"{pool} clients per round" if p.srpfl_pool
                 else f"all {num_clients} clients per round") + f" ({p.straggler} speeds)",
        "srpfl": f"SRPFL: fastest {p.initial_participants} of {pool}, doubling every "
                 f"{p.stage_rounds} rounds ({p.straggler} speeds)",
    }[p.participation]


def build_run_process(algorithm: str, task, config: RunConfig):
    """`algorithm`'s process over `task`, with the run's optimizers and local work
    (`runner.algorithms.build_algorithm`), starting from `config.model.init_adapters` when
    given (`initial_weights`)."""
    return algorithms.build_algorithm(algorithm, task, config, initial_weights(task, config))


def build_evaluator(algorithm: str, task, process, config: RunConfig):
    """evaluate(state[, store]) -> metrics: the global model, or the personalized models."""
    personalized = algorithm in algorithms.PERSONALIZED_ALGORITHMS
    if config.output.eval_per_client:
        # The pooled metrics too, from the same pass over each client's test set.
        return algorithms.per_client_evaluator(task, process, personalized)
    if personalized:
        return algorithms.personalized_evaluator(task, process)

    def evaluate(state, store=None):
        del store  # heterogeneous ranks: the clients' ranks; the global model is evaluated
        # The base by reference: the evaluator's model reads it once, not each evaluation.
        return task.evaluate(process.model_weights(state, base_by_reference=True))
    return evaluate


def _saving_predictions(evaluate_fn, log, process, output_dir: pathlib.Path):
    """`evaluate_fn` that also adds each evaluation's per-example predictions to the run's
    `predictions.npz` (`tffl.simulation.predictions`), as the round it evaluated."""

    def evaluate(state, store=None):
        metrics = evaluate_fn(state) if store is None else evaluate_fn(state, store)
        log.save(output_dir, process.round_num(state))
        return metrics

    return evaluate


def initial_weights_with_adapters(keras_model_fn, input_spec, folder: str | pathlib.Path,
                                  initial_non_trainable=None, family: str | None = None
                                  ) -> tuple[list[np.ndarray], list[np.ndarray], list[str]]:
    """`(trainable, non_trainable, names)`: a process's starting weights with the adapters (and
    head) of a PEFT `folder` (`models.peft_export.init_adapters`), for a process builder's
    `initial_trainable=` and `initial_non_trainable=`. The model's own initial values are drawn
    once (`tffl.engine.frozen.initial_values`, what the builder would draw);
    `initial_non_trainable` (e.g. a pretrained backbone) replaces the drawn non-trainable ones."""
    from models import peft_export
    from tffl.engine import frozen
    from tffl.engine.model_spec import build_model

    trainable, non_trainable = frozen.initial_values(
        keras_model_fn, input_spec, draw_non_trainable=initial_non_trainable is None)
    if initial_non_trainable is not None:
        non_trainable = [np.asarray(v) for v in initial_non_trainable]
    model = build_model(keras_model_fn, input_spec, zero_init=True)
    for variable, value in zip(model.trainable_variables + model.non_trainable_variables,
                               trainable + non_trainable, strict=True):
        variable.assign(value)
    names = peft_export.init_adapters(model, folder, family)
    return [v.numpy() for v in model.trainable_variables], non_trainable, names


def initial_weights(task, config: RunConfig):
    """`(trainable, non_trainable)` the model starts from: its own draw and the task's
    pretrained weights with the LoRA adapters (and head) of the PEFT folder
    `config.model.init_adapters` (`UsageError` naming the flag if it does not fit the model);
    None without that folder (the builder's own draw)."""
    folder = config.model.init_adapters
    if folder is None:
        return None
    pretrained = task.pretrained_non_trainable() if task.pretrained_non_trainable else None
    try:
        trainable, non_trainable, names = initial_weights_with_adapters(
            task.keras_model_fn, task.input_spec, folder, initial_non_trainable=pretrained)
    except ValueError as e:
        raise _as_usage_error(e, config) from None
    announce(f"starting from {len(names)} adapter variables of {folder}")
    return trainable, non_trainable


_WARNED = set()
LABELS_FILE = "labels.json"


def warn_random_backbone(backbone: str) -> None:
    """Once per process and backbone: a random test backbone's results say nothing about the
    algorithms."""
    if backbone in _WARNED:
        return
    _WARNED.add(backbone)
    print(f"tffl: note: --backbone={backbone} is a random network for tests, smoke runs and "
          "measurements, not a pretrained model: LoRA barely moves it, and its results say "
          "nothing about the algorithms (use --backbone=minilm for text, gemma3_270m for "
          "instructions)", flush=True)


def write_labels(output_dir: pathlib.Path, label_names) -> None:
    """`labels.json` in the run folder: the label of each class index, as the model predicts
    them (`{"labels": [name of 0, name of 1, ...]}`)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / LABELS_FILE).write_text(json.dumps({"labels": list(label_names)}, indent=1))


def run_algorithm(algorithm: str, output_dir: pathlib.Path, config: RunConfig) -> dict:
    """Builds the task and `algorithm` from `config`, runs `tffl.simulation.driver.run_rounds`
    into `output_dir` and writes its `summary.json`; returns the summary.

    Must run inside a `tffl.runtime` context. A value that cannot work raises `UsageError`.
    """
    from tffl.simulation import driver

    tf.keras.utils.set_random_seed(config.algorithm.seed)
    identity = run_identity(config, algorithm)
    task = run_task_for(algorithm, config)
    rounds = config.algorithm.rounds
    print(f"tffl: {algorithm} on {task.description}; {participants(config)}, "
          f"{counted(rounds, 'communication round')} -> {output_dir}", flush=True)
    if task.random_backbone:
        warn_random_backbone(config.model.backbone)
    if task.label_names is not None:
        write_labels(output_dir, task.label_names)
    started = time.perf_counter()
    announce(f"building {algorithm}'s TFF computations")
    process = build_run_process(algorithm, task, config)
    evaluate_fn = build_evaluator(algorithm, task, process, config)
    if (task.prediction_log is not None and not config.output.eval_per_client
            and algorithm not in algorithms.PERSONALIZED_ALGORITHMS):  # the global model's
        evaluate_fn = _saving_predictions(evaluate_fn, task.prediction_log, process, output_dir)
    if config.output.evaluate_only:
        return evaluate_checkpoint(process, output_dir, evaluate_fn, identity, algorithm,
                                   started)
    try:
        sampler = algorithms.build_sampler(task, config.participation, config.algorithm.seed)
    except ValueError as e:
        raise _as_usage_error(e, config) from None
    machine.read_legs(output_dir)  # a damaged record stops the run here, before any round
    leg_recorded = []

    def record_leg(row, state):
        # Once per leg, after its first round: a leg that trained no round leaves no
        # line (runner.machine.record_leg).
        del state
        if not leg_recorded:
            machine.record_leg(output_dir, row["round"])
            leg_recorded.append(row["round"])

    result = driver.run_rounds(
        process, sampler, task.client_dataset_fn, rounds, output_dir,
        driver.RunOptions(
            evaluate_fn=evaluate_fn, eval_every=config.output.eval_every,
            checkpoint_every=config.output.checkpoint_every, config=identity,
            resume=config.output.resume, log=lambda line: print(line, flush=True),
            after_round=record_leg))
    summary = _summary(algorithm, result.history, identity | {"rounds": rounds}, output_dir,
                       started)
    summary.update(eval_split=task.eval_split, num_classes=task.num_classes,
                   random_backbone=task.random_backbone)
    if algorithm == "flute" and config.algorithm.flute_final_head_epochs:
        ids, train, test = task.client_eval_data()
        final = process.evaluate_final(result.state, train, test,
                                       result.personal_store.lookup(ids))
        summary["final_head_round"] = {f"personal_{k}": v for k, v in final.items()}
        print(f"final round ({config.algorithm.flute_final_head_epochs} head epochs on every "
              f"client): personalized test accuracy {final['accuracy']:.4f}", flush=True)
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    return summary


def _summary(algorithm: str, history: list[dict], flags: Mapping[str, Any],
             output_dir: pathlib.Path, started: float) -> dict:
    """summary.json's content: final and best metrics, bytes, time, peak memory and the
    legs."""
    from tffl.simulation import metrics_log

    last = history[-1] if history else {}
    evals = [r["eval_accuracy"] for r in history if "eval_accuracy" in r]
    personal = [r["eval_personal_accuracy"] for r in history if "eval_personal_accuracy" in r]
    return {
        "algorithm": algorithm,
        "flags": dict(flags),
        "rounds_completed": last.get("round", 0),
        "communication_rounds": last.get("communication_rounds", 0),
        "best_eval_accuracy": max(evals) if evals else None,
        "best_personal_accuracy": max(personal) if personal else None,
        "upload_bytes_per_client_total": sum(r.get("bytes_up_per_client", 0) for r in history),
        "final": {k: v for k, v in last.items() if k not in metrics_log.MACHINE_COLUMNS},
        "wall_seconds_this_run": time.perf_counter() - started,
        # MB, the largest over every leg's rounds (`tffl.simulation.memory`); None: unread.
        **{column: max((r[column] for r in history if column in r), default=None)
           for column in ("peak_rss_mb", "worker_peak_rss_mb")},
        "machine": machine.describe(),  # of the leg that finished the run
        # The code's commit (and whether its tree was dirty) and the libraries' versions.
        "provenance": machine.provenance(),
        "legs": machine.read_legs(output_dir),  # each leg's first round and machine
    }


EVALUATION_FILE = "evaluation.json"


def evaluate_untrained(algorithm: str, output_dir: pathlib.Path, config: RunConfig) -> dict:
    """The zero-shot row: `config`'s task evaluated on the model as `algorithm`'s process starts
    it (LoRA's B = 0: the pretrained base itself), nothing trained; written as the summary.json
    of a run of 0 rounds (`final`: the `eval_*` metrics; `provenance` and `machine` as every
    run's), and returned. Must run inside a `tffl.runtime` context."""
    tf.keras.utils.set_random_seed(config.algorithm.seed)
    task = run_task_for(algorithm, config)
    print(f"tffl: {algorithm} untrained on {task.description} -> {output_dir}", flush=True)
    started = time.perf_counter()
    process = build_run_process(algorithm, task, config)
    metrics = task.evaluate(process.model_weights(process.initialize()))
    summary = {
        "algorithm": algorithm, "flags": run_identity(config, algorithm) | {"rounds": 0},
        "rounds_completed": 0, "communication_rounds": 0,
        "best_eval_accuracy": metrics.get("accuracy"), "best_personal_accuracy": None,
        "upload_bytes_per_client_total": 0,
        "final": {f"eval_{k}": float(v) for k, v in metrics.items()},
        "wall_seconds_this_run": time.perf_counter() - started,
        "eval_split": task.eval_split, "num_classes": task.num_classes,
        "machine": machine.describe(), "provenance": machine.provenance()}
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    return summary


def evaluated_identity(identity: Mapping[str, Any], recorded: Mapping[str, Any]
                       ) -> dict[str, Any]:
    """The identity a checkpoint is checked against under --evaluate_only: `identity` (the
    flags given) with the evaluation flags (`EVALUATION_FLAGS`) as the checkpoint `recorded`
    them, since they change what is evaluated, not what was trained.

    >>> trained = {"algorithm": "rolora", "seed": 0}
    >>> evaluated_identity(trained | {"eval_test": True}, trained) == trained
    True
    >>> evaluated_identity({"algorithm": "rolora", "seed": 1}, trained)["seed"]   # refused later
    1
    """
    return {k: v for k, v in identity.items() if k not in EVALUATION_FLAGS} | {
        k: recorded[k] for k in EVALUATION_FLAGS if k in recorded}


def evaluate_checkpoint(process, output_dir: pathlib.Path, evaluate_fn, config: Mapping[str, Any],
                        algorithm: str, started: float) -> dict:
    """--evaluate_only: the newest checkpoint of the run in `output_dir` (trained with the same
    flags: `config`, but for `EVALUATION_FLAGS`), evaluated once by `evaluate_fn` and written to
    `evaluation.json` as {"round", "metrics": {"eval_<name>": value}}; nothing is trained.

    When that checkpoint is the run's last round (its summary.json's `rounds_completed`), the
    metrics its `final` lacks (e.g. `eval_personal_test_accuracy` after the held-out split was
    added) are added to it and listed under `evaluated_later`, with the largest difference
    between a metric it already held and its recomputed value (0 when the checkpoint restores
    the run exactly). Returns that summary, or for an unfinished run one of the evaluation."""
    from tffl.simulation import checkpoint, driver

    found = checkpoint.latest(output_dir / driver.CHECKPOINT_DIR)
    if found is None:
        raise UsageError(f"flag --evaluate_only: {output_dir} holds no checkpoint; train the run "
                         "first (the same flags without --evaluate_only)")
    done = found[0]
    config = evaluated_identity(
        config, json.loads((found[1] / "meta.json").read_text()).get("config", {}))
    try:
        result = driver.run_rounds(
            process, None, None, done, output_dir,
            driver.RunOptions(config=config, resume=True, log=None, tensorboard=False))
    except (driver.ResumeError, checkpoint.CheckpointMismatchError) as e:
        raise UsageError(f"flag --evaluate_only: {e}; pass the flags the run was trained "
                         "with") from e
    store = result.personal_store
    evaluated = evaluate_fn(result.state, store) if store is not None else evaluate_fn(result.state)
    metrics = {f"eval_{k}": float(v) for k, v in evaluated.items()}
    (output_dir / EVALUATION_FILE).write_text(
        json.dumps({"round": done, "metrics": metrics}, indent=1, sort_keys=True))
    summary_path = output_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    if summary is None or summary.get("rounds_completed") != done:
        last = result.history[-1] if result.history else {}
        return {"algorithm": algorithm, "rounds_completed": done,
                "communication_rounds": last.get("communication_rounds", 0),
                "final": {**{k: v for k, v in last.items() if k.startswith("train_")},
                          **metrics},
                "wall_seconds_this_run": time.perf_counter() - started}
    final = summary["final"]
    held = [k for k in metrics if k in final]
    added = sorted(k for k in metrics if k not in final)
    final.update({k: metrics[k] for k in added})
    summary["evaluated_later"] = {
        "round": done, "added": added,
        "max_abs_difference_of_held_metrics": max(
            (abs(final[k] - metrics[k]) for k in held), default=None)}
    summary_path.write_text(json.dumps(summary, indent=1, sort_keys=True))
    print(f"evaluated round {done} of {output_dir}: added {', '.join(added) or 'nothing'} to "
          f"summary.json", flush=True)
    return summary
