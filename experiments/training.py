"""One training run of `scripts/train.py`: flag values -> task, algorithm, sampler -> the round
driver (`tffl.simulation.driver.run_rounds`) -> metrics, checkpoints and `summary.json`.

`run_algorithm(algorithm, output_dir, options)` takes train.py's flag values by flag name (its
`--help` documents each); the script checks them first.
"""

from __future__ import annotations

import json
import pathlib
import re
import time
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from experiments import algorithms
from experiments import machine
from experiments.cli import UsageError
from tasks import registry

# Flags that name a run's math; --resume refuses a checkpoint written with other values.
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


# AdaptPFL's variant and ablation switches (`tffl.algorithms.adaptpfl.AdaptPflConfig`), with their defaults.
ADAPTPFL_FLAGS = {"adaptpfl_variant": "a", "adaptpfl_order": None, "shortcut_ridge": 0.0,
                  "project_shortcut": True, "shortcut_damping": 1.0, "head_damping": 1.0}


def adaptpfl_config(options: Mapping[str, Any]):
    """The AdaptPflConfig of the --adaptpfl_variant, --adaptpfl_order, --shortcut_ridge,
    --project_shortcut, --shortcut_damping and --head_damping options."""
    from tffl.algorithms import adaptpfl

    return adaptpfl.AdaptPflConfig(
        variant=options["adaptpfl_variant"], order=options["adaptpfl_order"],
        shortcut_ridge=options["shortcut_ridge"], project_shortcut=options["project_shortcut"],
        shortcut_damping=options["shortcut_damping"], head_damping=options["head_damping"])


def client_ranks(options: Mapping[str, Any]) -> list[int]:
    """--client_ranks as integers (empty without it)."""
    return [int(r) for r in options["client_ranks"] or []]


def adapter_rank(options: Mapping[str, Any]) -> int:
    """--rank, or the largest client rank when --client_ranks is given without --rank."""
    if options["client_ranks"] and not options["rank_present"]:
        return max(client_ranks(options))
    return options["rank"]


def _as_usage_error(error: ValueError, options: Mapping[str, Any]) -> ValueError:
    """A library error that names a parameter first (`rank=65: ...`, `data_dir is needed: ...`)
    as the CLI's one line naming the flag that set it (`flag --rank=65: ...`); the adapters'
    rank set by --client_ranks names that flag. Other errors as they are."""
    message = str(error)
    param = re.match(r"[a-z_]+", message)
    if param is None or param.group() not in options:
        return error
    param, rest = param.group(), message[param.end():]
    if param == "rank" and options["client_ranks"] and not options["rank_present"]:
        return UsageError(f"flag --client_ranks={','.join(options['client_ranks'])}: "
                          f"rank {rest.lstrip('=')}")
    return UsageError(f"flag --{param}{rest}" if rest.startswith("=") else
                      f"flag --{param}:{rest}")


def run_algorithm(algorithm: str, output_dir: pathlib.Path, options: Mapping[str, Any]) -> dict:
    """Builds the task and `algorithm` from `options` (train.py's flag values by flag name, plus
    `rank_present`: whether --rank was given), runs `tffl.simulation.driver.run_rounds` into
    `output_dir` and writes its `summary.json`; returns the summary.

    Must run inside a `tffl.runtime` context. A flag value that cannot work raises `UsageError`.
    """
    from tffl.algorithms import lora_ranks
    from tffl.algorithms import personalized
    from tffl.simulation import driver as simulation

    tf.keras.utils.set_random_seed(options["seed"])
    config = {name: options[name] for name in RUN_FLAGS} | {"algorithm": algorithm}
    # Flags added later enter the configuration only when not at their default, so that runs
    # from before them still resume.
    for name, default in (("srpfl_pool", 0), ("flute_variant", "star"),
                          ("flute_feature_reduction", "mean"), ("representation_blocks", 1),
                          ("client_ranks", None), ("flute_final_head_epochs", 0),
                          ("eval_test", False), ("eval_per_client", False),
                          *ADAPTPFL_FLAGS.items()):
        if options[name] != default:
            config[name] = options[name]
    config["rank"] = adapter_rank(options)
    try:
        task = registry.build_task(
            options["task"],
            num_clients=options["num_clients"],
            batch_size=options["batch_size"],
            local_steps=options["local_steps"],
            seed=options["seed"],
            partition=options["partition"],
            classes_per_client=options["classes_per_client"],
            dirichlet_alpha=options["dirichlet_alpha"],
            data_dir=options["data_dir"],
            model=algorithms.model_for(algorithm, options["representation"]),
            rank=adapter_rank(options),
            shortcut_alpha=options["shortcut_alpha"],
            backbone=options["backbone"],
            lora_alpha=options["lora_alpha"],
            lora_targets=tuple(options["lora_targets"]),
            lora_layers=(tuple(int(i) for i in options["lora_layers"])
                         if options["lora_layers"] else None),
            sequence_length=options["sequence_length"],
            pooling=options["pooling"],
            head=options["head"],
            prefix_cache=options["prefix_cache"],
            bucket_by_length=options["bucket_by_length"],
            # Workers at other addresses may not see this machine's files: send rounds in the call.
            rounds_on_disk=not options["worker_addresses"],
            eval_test=options["eval_test"],
        )
    except ValueError as e:
        raise _as_usage_error(e, options) from None
    who = {
        "uniform": f"{registry.counted(options['clients_per_round'], 'client')} per round",
        "full": (f"{options['srpfl_pool']} random of {options['num_clients']} clients per round"
                 if options['srpfl_pool'] else f"all {options['num_clients']} clients per round")
                + f" ({options['straggler']} speeds)",
        "srpfl": f"SRPFL: fastest {options['initial_participants']} of "
                 + (f"{options['srpfl_pool']} random of {options['num_clients']}" if options['srpfl_pool']
                    else f"{options['num_clients']}") + ", doubling "
                 f"every {options['stage_rounds']} rounds ({options['straggler']} speeds)",
    }[options["participation"]]
    print(
        f"tffl: {algorithm} on {task.description}; {who}, "
        f"{registry.counted(options['rounds'], 'communication round')} -> {output_dir}",
        flush=True,
    )
    started = time.perf_counter()
    process = algorithms.build_algorithm(
        algorithm,
        task,
        client_learning_rate=algorithms.build_optimizer(
            options["client_optimizer"], options["learning_rate"], options["client_momentum"]),
        server_optimizer=algorithms.build_optimizer(
            options["server_optimizer"], options["server_learning_rate"], options["server_momentum"]),
        weight_decay=options["weight_decay"],
        frozen_dir=options["frozen_dir"],
        communication_rounds=options["rounds"],
        rolora_fraction=options["rolora_fraction"],
        representation=options["representation"],
        client_ranks=(lora_ranks.assign_ranks(task.client_ids, client_ranks(options))
                      if options["client_ranks"] else None),
        averaging_error=options["averaging_error"],
        local_epochs=options["local_epochs"],
        head_epochs=(None if algorithm == "flute" and options["flute_variant"] == "plain"
                     else options["head_epochs"]),
        representation_epochs=options["representation_epochs"],
        representation_blocks=options["representation_blocks"],
        finetune_epochs=options["finetune_epochs"],
        shortcut_epochs=options["shortcut_epochs"],
        adaptpfl=adaptpfl_config(options) if algorithm == "adaptpfl" else None,
        flute=personalized.FluteConfig(
            feature_penalty=options["flute_feature_penalty"], head_penalty=options["flute_head_penalty"],
            nc_penalty=options["flute_nc_penalty"], nc_step=options["flute_nc_step"],
            feature_reduction=options["flute_feature_reduction"], variant=options["flute_variant"],
            final_head_epochs=options["flute_final_head_epochs"]),
    )
    if algorithm in algorithms.PERSONALIZED_ALGORITHMS:
        evaluate_fn = algorithms.personalized_evaluator(task, process)
    else:
        def evaluate_fn(state, store=None):
            del store  # heterogeneous ranks: the clients' ranks; the global model is evaluated
            return task.evaluate(process.model_weights(state))
    if options["eval_per_client"]:
        # The pooled metrics too, from the same pass over each client's test set.
        evaluate_fn = algorithms.per_client_evaluator(
            task, process, algorithm in algorithms.PERSONALIZED_ALGORITHMS)
    if options["evaluate_only"]:
        return evaluate_checkpoint(process, output_dir, evaluate_fn, config, algorithm, started)
    stage_rounds = options["stage_rounds"]
    sampler = algorithms.build_sampler(
        task, options["clients_per_round"], options["seed"], kind=options["participation"],
        initial_participants=options["initial_participants"],
        stage_rounds=stage_rounds if stage_rounds == "lemma_b1" else int(stage_rounds),
        straggler=options["straggler"], communication_cost=options["communication_cost"],
        pool=options["srpfl_pool"] or None,
    )
    machine.read_sittings(output_dir)  # a damaged record stops the run here, before any round
    sitting_recorded = []

    def record_sitting(row, state):
        # Once per sitting, after its first round: a sitting that trained no round leaves no
        # line (experiments.machine.record_sitting).
        del state
        if not sitting_recorded:
            machine.record_sitting(output_dir, row["round"])
            sitting_recorded.append(row["round"])

    result = simulation.run_rounds(
        process,
        sampler=sampler,
        client_dataset_fn=task.client_dataset_fn,
        rounds=options["rounds"],
        output_dir=output_dir,
        evaluate_fn=evaluate_fn,
        eval_every=options["eval_every"],
        checkpoint_every=options["checkpoint_every"],
        config=config,
        resume=options["resume"],
        log=lambda line: print(line, flush=True),
        after_round=record_sitting,
    )
    history = result.history
    last = history[-1] if history else {}
    evals = [r["eval_accuracy"] for r in history if "eval_accuracy" in r]
    personal = [r["eval_personal_accuracy"] for r in history if "eval_personal_accuracy" in r]
    summary = {
        "algorithm": algorithm,
        "flags": config | {"rounds": options["rounds"]},
        "rounds_completed": last.get("round", 0),
        "communication_rounds": last.get("communication_rounds", 0),
        "best_eval_accuracy": max(evals) if evals else None,
        "best_personal_accuracy": max(personal) if personal else None,
        "upload_bytes_per_client_total": sum(r.get("bytes_up_per_client", 0) for r in history),
        "final": {k: v for k, v in last.items() if k not in simulation.TIMING_COLUMNS},
        "wall_seconds_this_run": time.perf_counter() - started,
        "machine": machine.describe(),  # of the sitting that finished the run
        "sittings": machine.read_sittings(output_dir),  # each sitting's first round and machine
    }
    if algorithm == "flute" and options["flute_final_head_epochs"]:
        ids, train, test = task.client_eval_data()
        final = process.evaluate_final(result.state, train, test,
                                       result.personal_store.lookup(ids))
        summary["final_head_round"] = {f"personal_{k}": v for k, v in final.items()}
        print(f"final round ({options['flute_final_head_epochs']} head epochs on every client): "
              f"personalized test accuracy {final['accuracy']:.4f}", flush=True)
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    return summary


EVALUATION_FILE = "evaluation.json"


def evaluate_checkpoint(process, output_dir: pathlib.Path, evaluate_fn, config: Mapping[str, Any],
                        algorithm: str, started: float) -> dict:
    """--evaluate_only: the newest checkpoint of the run in `output_dir` (trained with the same
    flags: `config`), evaluated once by `evaluate_fn` and written to `evaluation.json` as
    {"round", "metrics": {"eval_<name>": value}}; nothing is trained.

    When that checkpoint is the run's last round (its summary.json's `rounds_completed`), the
    metrics its `final` lacks (e.g. `eval_personal_test_accuracy` after the held-out split was
    added) are added to it and listed under `evaluated_later`, with the largest difference
    between a metric it already held and its recomputed value (0 when the checkpoint restores
    the run exactly). Returns that summary, or for an unfinished run one of the evaluation."""
    from tffl.simulation import checkpoint
    from tffl.simulation import driver as simulation

    found = checkpoint.latest(output_dir / simulation.CHECKPOINT_DIR)
    if found is None:
        raise UsageError(f"flag --evaluate_only: {output_dir} holds no checkpoint; train the run "
                         "first (the same flags without --evaluate_only)")
    done = found[0]
    try:
        result = simulation.run_rounds(process, sampler=None, client_dataset_fn=None,
                                       rounds=done, output_dir=output_dir, config=config,
                                       resume=True, log=None, tensorboard=False)
    except (simulation.ResumeError, checkpoint.CheckpointMismatchError) as e:
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
