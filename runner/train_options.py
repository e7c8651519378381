"""scripts/train.py's flag values checked together, before TensorFlow is even imported.

`check(options, present)` takes every flag value by flag name (`options`, the flag values of an
`runner.run_config.RunConfig`, with "rank_present") and the names of the flags given
on the command line (`present`); it raises `UsageError` naming the first flag whose value cannot
work, with what to do instead. `output_dir(options)` resolves --output_dir (or a fresh
runs/<task>-<algorithms>-<time>) and proves it writable.

>>> options = dict(DEFAULTS, algorithm=["rolora"], clients_per_round=8, num_clients=5)
>>> check(options, present={"algorithm", "clients_per_round"})
Traceback (most recent call last):
...
runner.cli.UsageError: flag --clients_per_round=8: must be <= --num_clients=5
>>> check(dict(DEFAULTS, algorithm=["rolora"]), present={"algorithm"})   # passes: no output

DEFAULTS are the flags' defaults, from `runner.run_config.RunConfig` (their one place;
`runner.train_flags` defines the flags with them). Nothing here imports TensorFlow (nor absl): the choices below repeat those of the
modules that do (`runner.algorithms`, `tasks.registry`, `runner.training`), and
tests/scripts/test_train_cli.py proves that they match.
"""

from __future__ import annotations

import datetime
import math
import pathlib
from collections.abc import Collection, Mapping
from typing import Any

from runner import cli
from runner.cli import UsageError
from runner.run_config import RunConfig

# `runner.algorithms`: KERAS_ALGORITHMS (the Keras-model ones of `tffl.algorithms.registry`),
# LORA_ALGORITHMS (its `lora` family), REPRESENTATIONS, PARTICIPATIONS, STRAGGLER_MODELS,
# OPTIMIZERS; `tasks.registry`: TASKS, TEXT_TASKS, INSTRUCT_TASKS, BACKBONES, PARTITIONS;
# `models.decoders`: DECODERS.
KERAS_ALGORITHMS = ("fedrep", "fedper", "lg_fedavg", "fedavg", "fedavg_ft", "flute", "adaptpfl",
                    "fedsa_lora", "rolora", "fedavg_lora", "ffa_lora", "flexlora", "flora",
                    "rolora_ffa")
LORA_ALGORITHMS = ("rolora", "fedavg_lora", "ffa_lora", "flexlora", "flora", "rolora_ffa")
REPRESENTATIONS = ("mlp", "lora", "lora_alternating")
PARTICIPATIONS = ("uniform", "full", "srpfl")
STRAGGLER_MODELS = ("fixed", "dynamic")
OPTIMIZERS = ("sgd", "sgdm", "adam")
TEXT_TASKS = ("sst2", "reviews", "text")
INSTRUCT_TASKS = ("sst2_instruct", "reviews_instruct", "instruct")  # a decoder LM answers
# The tasks that read a user's data (`tasks.task_config.FILE_TASKS`), the flags that name it,
# and the suffixes of the files they read (`tasks.data_files.FORMATS`).
FILE_TASKS = ("text", "instruct")
FILE_FLAGS = ("train_file", "dev_file", "test_file", "tfds_name", "tfds_splits", "text_column",
              "text_pair_column", "label_column", "client_column")
TEXT_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson")
INSTRUCTION_SUFFIXES = (*TEXT_SUFFIXES, ".json")
TASKS = ("digits", "mnist", *TEXT_TASKS, *INSTRUCT_TASKS)
ENCODERS = ("tiny", "minilm")            # the classification tasks' backbones
DECODERS = ("gpt2_tiny", "gemma3_270m", "gemma3_1b_random")  # the instruction tasks'
# The decoders whose frozen base can be stored at a lower precision (`models.decoders`).
LOWER_BASE_DECODERS = ("gemma3_270m", "gemma3_1b_random")
BACKBONES = (*ENCODERS, *DECODERS)
PARTITIONS = ("iid", "shards", "dirichlet")
# The image tasks' input widths (8x8 digits, 28x28 MNIST): the LoRA nets' largest rank.
INPUT_WIDTHS = {"digits": 64, "mnist": 784}
REVIEW_DOMAINS = 5  # --task=reviews: its clients split each domain equally
# AdaptPFL's switches (`runner.algorithms.adaptpfl_config`).
ADAPTPFL_FLAGS = ("adaptpfl_variant", "adaptpfl_order", "shortcut_ridge", "project_shortcut",
                  "shortcut_damping", "head_damping")
SEED_LIMIT = 2**32  # NumPy's seeds are in [0, 2**32)

# scripts/train.py's flags and their defaults (its --help documents each), and "rank_present"
# (whether --rank was given): `runner.run_config.RunConfig`'s defaults as flag values, a
# starting point for options built without absl, as above.
DEFAULTS: dict[str, Any] = RunConfig().flag_values()


def client_ranks(options: Mapping[str, Any]) -> list[int]:
    """--client_ranks as integers (empty without it)."""
    return [int(r) for r in options["client_ranks"] or []]


def adapter_rank(options: Mapping[str, Any]) -> int:
    """--rank, or the largest client rank when --client_ranks is given without --rank (as
    `runner.run_config.ModelConfig.adapter_rank`)."""
    if options["client_ranks"] and not options["rank_present"]:
        return max(client_ranks(options))
    return options["rank"]


def _at_least(options: Mapping[str, Any], name: str, minimum: int = 1) -> None:
    cli.at_least(name, options[name], minimum)


def _check_workers(options: Mapping[str, Any]) -> None:
    _at_least(options, "workers")
    if options["runtime"] == "distribute":
        if options["workers"] != 1 or options["worker_addresses"]:
            raise UsageError("flags --workers/--worker_addresses are for --runtime=tff; "
                             "--runtime=distribute runs in this process over --devices")
        if options["logical_cpus"] < 0:
            raise UsageError(f"flag --logical_cpus={options['logical_cpus']}: must be >= 0")
    elif options["devices"] or options["logical_cpus"]:
        raise UsageError("flags --devices/--logical_cpus need --runtime=distribute (the TFF "
                         "worker of tensorflow-federated 0.87 runs on the CPU only)")
    if options["runtime"] == "distribute" and options["graph_optimization"] == "none":
        raise UsageError(f"flag --graph_optimization={options['graph_optimization']}: is for "
                         "--runtime=tff; --runtime=distribute keeps TFF's pass (its function "
                         "inlining keeps dataset inputs off GPUs)")
    if options["max_concurrent_calls"] is not None and (
            options["max_concurrent_calls"] < 1 or options["runtime"] != "tff"
            or options["worker_addresses"]):
        raise UsageError(f"flag --max_concurrent_calls={options['max_concurrent_calls']}: must "
                         "be >= 1, and is for local TFF workers (--runtime=tff without "
                         "--worker_addresses; a remote worker takes it from "
                         "scripts/start_worker.py --max_concurrent_computation_calls)")
    if not options["worker_timeout"] > 0:
        raise UsageError(f"flag --worker_timeout={options['worker_timeout']}: must be > 0")
    if options["worker_addresses"] and options["workers"] != 1:
        raise UsageError(f"flag --workers={options['workers']}: give either --workers or "
                         "--worker_addresses")


def _check_adaptpfl(options: Mapping[str, Any], present: Collection[str]) -> None:
    changed = [n for n in ADAPTPFL_FLAGS if n in present]
    if changed and "adaptpfl" not in options["algorithm"]:
        raise UsageError(f"flag --{changed[0]}={options[changed[0]]}: is AdaptPFL's; "
                         "use it with --algorithm=adaptpfl")
    ridge = options["shortcut_ridge"]
    if not (math.isfinite(ridge) and ridge >= 0):
        raise UsageError(f"flag --shortcut_ridge={ridge}: must be >= 0")
    for name in ("shortcut_damping", "head_damping"):
        value = options[name]
        if not 0.0 < value <= 1.0:
            raise UsageError(f"flag --{name}={value}: must be in (0, 1] (1: no damping)")
        if value != 1.0 and options["adaptpfl_variant"] != "b":
            raise UsageError(f"flag --{name}={value}: damping is variant b's step; add "
                             "--adaptpfl_variant=b")


def _check_client_ranks(options: Mapping[str, Any]) -> None:
    if not options["client_ranks"]:
        return
    given = ",".join(options["client_ranks"])
    try:
        ranks = client_ranks(options)
    except ValueError:
        raise UsageError(f"flag --client_ranks={given}: must be integer ranks, e.g. "
                         "4,8,16") from None
    if min(ranks) < 1:
        raise UsageError(f"flag --client_ranks={given}: ranks must be >= 1")
    others = [a for a in options["algorithm"] if a not in ("flexlora", "flora")]
    if others:
        raise UsageError(f"flag --client_ranks={given}: only flexlora and flora aggregate "
                         f"adapters of different ranks, not {', '.join(others)}")
    if max(ranks) > adapter_rank(options):
        raise UsageError(f"flag --client_ranks={given}: rank {max(ranks)} is above "
                         f"--rank={options['rank']}; raise --rank or leave it unset (the "
                         "adapters then take the largest client rank)")


def _check_rank(options: Mapping[str, Any]) -> None:
    """The LoRA nets of the image tasks (`runner.algorithms.model_for`: the LoRA algorithms,
    fedsa_lora, and the personalized ones over a LoRA representation) factor a square kernel of
    the input width, so their rank is at most that (`tasks.registry`'s check, made earlier)."""
    width = INPUT_WIDTHS.get(options["task"])
    lora = [a for a in options["algorithm"] if a in LORA_ALGORITHMS or a == "fedsa_lora"
            or (a != "adaptpfl" and options["representation"] != "mlp")]
    rank = adapter_rank(options)
    if width is None or not lora or rank <= width:
        return
    if options["client_ranks"] and not options["rank_present"]:
        raise UsageError(f"flag --client_ranks={','.join(options['client_ranks'])}: rank "
                         f"{rank}: must be between 1 and the input width {width}")
    raise UsageError(f"flag --rank={rank}: must be between 1 and the input width {width}")


def _check_init_adapters(options: Mapping[str, Any]) -> None:
    """--init_adapters: a PEFT folder, for the text tasks (whose backbones have LoRA layers) and
    the instruction tasks on a decoder with a Hugging Face counterpart (gemma3_270m)."""
    folder = options["init_adapters"]
    if folder is None:
        return
    if options["task"] in INSTRUCT_TASKS and options.get("backbone") != "gemma3_270m":
        raise UsageError(f"flag --init_adapters={folder}: --backbone={options.get('backbone')} "
                         "has no Hugging Face counterpart whose PEFT adapters it could take; "
                         "PEFT adapters of a decoder are gemma3_270m's")
    if options["task"] not in TEXT_TASKS + INSTRUCT_TASKS:
        raise UsageError(f"flag --init_adapters={folder}: PEFT adapters are for the text tasks "
                         f"({', '.join(TEXT_TASKS + INSTRUCT_TASKS)}), not "
                         f"--task={options['task']}")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        if not (pathlib.Path(folder) / name).is_file():
            raise UsageError(f"flag --init_adapters={folder}: no {name} there; pass a folder "
                             "written by scripts/export_adapters.py")


def _check_data(options: Mapping[str, Any]) -> None:
    """The seed, and the data only --data_dir has (`tasks.text_run_task`'s checks, made
    earlier)."""
    if not 0 <= options["seed"] < SEED_LIMIT:
        raise UsageError(f"flag --seed={options['seed']}: must be between 0 and "
                         f"{SEED_LIMIT - 1} (a NumPy seed)")
    if options["task"] == "text":
        return   # its held-out test split: `_check_files`
    if options["eval_test"] and options["task"] not in ("sst2", "sst2_instruct"):
        raise UsageError(f"flag --eval_test: only --task=sst2 and sst2_instruct (and --task=text "
                         f"with --test_file) have a labeled test split beside their dev set, not "
                         f"--task={options['task']}")
    if options["data_dir"] is None and options["eval_test"]:
        raise UsageError("flag --eval_test=True: TFDS's SST-2 test split is unlabelled; pass "
                         "--data_dir=<folder with sst2/test-labeled.tsv>")
    if options["task"] not in ("reviews", "reviews_instruct"):
        return
    if options["data_dir"] is None:
        raise UsageError(f"flag --data_dir: is needed: task {options['task']!r} reads the five review "
                         "domains from a folder (they have no TFDS source); pass "
                         "--data_dir=<folder with multidomain_sentiment/>, e.g. ../shared/data")
    if options["num_clients"] % REVIEW_DOMAINS:
        raise UsageError(f"flag --num_clients={options['num_clients']}: the review task splits "
                         f"each of its {REVIEW_DOMAINS} domains into equal clients, so it must "
                         f"be a multiple of {REVIEW_DOMAINS}")


def _check_file(options: Mapping[str, Any], name: str, suffixes: tuple[str, ...]) -> None:
    path = options[name]
    if path is None:
        return
    if pathlib.Path(path).suffix.lower() not in suffixes:
        raise UsageError(f"flag --{name}={path}: a {', '.join(suffixes)} file, by its suffix, "
                         f"for --task={options['task']}")
    if not pathlib.Path(path).is_file():
        raise UsageError(f"flag --{name}={path}: no such file")


def _check_files(options: Mapping[str, Any], present: Collection[str]) -> None:
    """The user's data (--task=text or instruct): its files or TFDS dataset, its columns and
    how its rows become clients."""
    task = options["task"]
    given = [n for n in FILE_FLAGS if n in present]
    if task not in FILE_TASKS:
        if given:
            raise UsageError(f"flag --{given[0]}: names your own data, for --task=text or "
                             f"--task=instruct, not --task={task}")
        return
    if task == "text" and (options["train_file"] is None) == (options["tfds_name"] is None):
        raise UsageError("flag --task=text: give your rows as --train_file=<file> (CSV, TSV, "
                         "JSON Lines) or a TFDS dataset as --tfds_name=<name>, one of the two")
    if task == "instruct" and options["train_file"] is None:
        raise UsageError("flag --task=instruct: give your instructions as --train_file=<Alpaca "
                         "JSON or JSON Lines file>")
    wrong = {"instruct": ("test_file", "tfds_name", "tfds_splits", "text_column",
                          "text_pair_column", "label_column"),
             "text": ("dev_file", "test_file") if options["tfds_name"] else ("tfds_splits",)}
    for name in wrong[task]:
        if name in present:
            raise UsageError(f"flag --{name}: does not apply to --task={task}"
                             + (f" with --tfds_name={options['tfds_name']} (its splits are "
                                "--tfds_splits)" if options["tfds_name"] else ""))
    suffixes = INSTRUCTION_SUFFIXES if task == "instruct" else TEXT_SUFFIXES
    for name in ("train_file", "dev_file", "test_file"):
        _check_file(options, name, suffixes)
    splits = options["tfds_splits"] or []
    if options["tfds_name"] and len(splits) not in (2, 3):
        raise UsageError(f"flag --tfds_splits={','.join(splits)}: give the training and dev "
                         "splits, and optionally a test split (e.g. train,validation)")
    if options["eval_test"] and task == "text" and not (options["test_file"] or len(splits) == 3):
        raise UsageError("flag --eval_test: give the held-out test split as --test_file=<file> "
                         "(or a third split in --tfds_splits)")
    if options["client_column"] is not None:
        for name in ("partition", "num_clients"):
            if name in present:
                raise UsageError(f"flag --{name}={options[name]}: the clients come from "
                                 f"--client_column={options['client_column']}; drop one of "
                                 "the two")
    elif task == "instruct" and options["partition"] != "iid" and "partition" in present:
        raise UsageError(f"flag --partition={options['partition']}: instruction rows have no "
                         "labels to split by; use --partition=iid or --client_column=<column>")


def _check_model(options: Mapping[str, Any]) -> None:
    """The model's flags: LoRA, the representation and the task it is defined for."""
    _at_least(options, "rank")
    _check_client_ranks(options)
    _check_rank(options)
    if options["sequence_length"] is not None:
        _at_least(options, "sequence_length", minimum=4)
    if options["lora_alpha"] is not None and not options["lora_alpha"] > 0:
        raise UsageError(f"flag --lora_alpha={options['lora_alpha']}: must be > 0")
    try:
        [int(i) for i in options["lora_layers"] or []]
    except ValueError:
        raise UsageError(f"flag --lora_layers={','.join(options['lora_layers'])}: must be "
                         "integer layer indices") from None
    if options["prefix_cache_dtype"] != "float32" and (options["task"] not in TEXT_TASKS
                                                      or not options["prefix_cache"]):
        raise UsageError(f"flag --prefix_cache_dtype={options['prefix_cache_dtype']}: is for "
                         f"the prefix cache of the text tasks ({', '.join(TEXT_TASKS)}), "
                         "which --noprefix_cache turns off")
    if options["task"] in TEXT_TASKS and "adaptpfl" in options["algorithm"]:
        raise UsageError(f"flag --task={options['task']}: adaptpfl's shortcut model is defined "
                         "for the image tasks (an MLP representation)")
    if "adaptpfl" in options["algorithm"] and options["representation"] != "mlp":
        raise UsageError(f"flag --representation={options['representation']}: adaptpfl's "
                         "shortcut model needs --representation=mlp")
    if "fedsa_lora" in options["algorithm"] and options["representation"] == "lora_alternating":
        raise UsageError("flag --representation=lora_alternating: fedsa_lora trains A and its "
                         "personal B together every round; leave --representation at its default")


def _check_backbone(options: Mapping[str, Any]) -> None:
    """An encoder for the classification tasks, a decoder for the instruction tasks, and only
    the LoRA algorithms, evaluated globally, on a decoder."""
    task, backbone = options["task"], options["backbone"]
    base_dtype = options["base_dtype"]
    if base_dtype != "float32" and (task not in INSTRUCT_TASKS
                                    or backbone not in LOWER_BASE_DECODERS):
        raise UsageError(f"flag --base_dtype={base_dtype}: a lower-precision base is for the "
                         f"instruction tasks ({', '.join(INSTRUCT_TASKS)}) on "
                         f"--backbone={' or '.join(LOWER_BASE_DECODERS)}")
    if base_dtype != "float32" and "flora" in options["algorithm"]:
        raise UsageError(f"flag --base_dtype={base_dtype}: flora merges the adapters into the "
                         f"frozen kernels every round, which the {base_dtype} base would round "
                         "each time; pass --base_dtype=float32")
    if task in TEXT_TASKS and backbone in DECODERS:
        raise UsageError(f"flag --backbone={backbone}: task {task!r} trains a classifier on an "
                         f"encoder ({', '.join(ENCODERS)}); for a decoder pass "
                         f"--task={'instruct' if task == 'text' else task + '_instruct'}")
    if task not in INSTRUCT_TASKS:
        return
    if backbone not in DECODERS:
        raise UsageError(f"flag --backbone={backbone}: task {task!r} trains a decoder language "
                         f"model; choose one of {', '.join(DECODERS)}")
    others = [a for a in options["algorithm"] if a not in LORA_ALGORITHMS]
    if others:
        raise UsageError(f"flag --algorithm={','.join(options['algorithm'])}: task {task!r} "
                         f"runs the LoRA algorithms ({', '.join(LORA_ALGORITHMS)}), not "
                         f"{others[0]}")
    if options["eval_per_client"]:
        raise UsageError(f"flag --eval_per_client: task {task!r} evaluates the global model on "
                         "the pooled split only")


def _check_local_work(options: Mapping[str, Any], present: Collection[str]) -> None:
    """The epochs and penalties of the personalized algorithms' client work."""
    algorithm = options["algorithm"]
    for name in ("local_epochs", "head_epochs", "representation_epochs", "initial_participants",
                 "shortcut_epochs", "representation_blocks"):
        _at_least(options, name)
    if not 0.0 <= options["shortcut_alpha"] <= 1.0:
        raise UsageError(f"flag --shortcut_alpha={options['shortcut_alpha']}: must be in [0, 1]")
    _check_adaptpfl(options, present)
    if ("flute" in algorithm and options["flute_variant"] == "plain"
            and "head_epochs" in present):
        raise UsageError(f"flag --head_epochs={options['head_epochs']}: plain FLUTE (the "
                         "paper's Algorithm 2) has no head-only epochs; use --local_epochs, or "
                         "--flute_variant=star")
    for name in ("flute_feature_penalty", "flute_head_penalty", "flute_nc_penalty",
                 "flute_nc_step"):
        if not options[name] >= 0:
            raise UsageError(f"flag --{name}={options[name]}: must be >= 0")
    _at_least(options, "flute_final_head_epochs", minimum=0)
    if options["flute_final_head_epochs"] and "flute" not in algorithm:
        raise UsageError(f"flag --flute_final_head_epochs={options['flute_final_head_epochs']}: "
                         "is FLUTE's final round; use it with --algorithm=flute")
    if options["representation_blocks"] > 1 and set(algorithm) - {"fedrep"}:
        raise UsageError(f"flag --representation_blocks={options['representation_blocks']}: "
                         "interleaves FedRep's head and representation epochs; use it with "
                         "--algorithm=fedrep only")
    if options["finetune_epochs"] is not None:
        _at_least(options, "finetune_epochs", minimum=0)
    if options["finetune_epochs"] and "fedavg" in algorithm:
        raise UsageError(f"flag --finetune_epochs={options['finetune_epochs']}: fedavg evaluates "
                         "the global model as it is; use --algorithm=fedavg_ft to fine-tune heads")
    if not 0.0 <= options["rolora_fraction"] <= 1.0:
        raise UsageError(f"flag --rolora_fraction={options['rolora_fraction']}: must be in "
                         "[0, 1]")


def _check_participation(options: Mapping[str, Any]) -> None:
    """SRPFL's participation flags and the clients sampled per round."""
    if options["stage_rounds"] != "lemma_b1":
        try:
            stage_rounds = int(options["stage_rounds"])
        except ValueError:
            stage_rounds = 0
        if stage_rounds < 1:
            raise UsageError(f"flag --stage_rounds={options['stage_rounds']}: must be an "
                             "integer >= 1 or lemma_b1")
    if not options["communication_cost"] >= 0:
        raise UsageError(f"flag --communication_cost={options['communication_cost']}: must be "
                         ">= 0")
    pool, num_clients = options["srpfl_pool"], options["num_clients"]
    if pool:
        if options["participation"] not in ("srpfl", "full"):
            raise UsageError(f"flag --srpfl_pool={pool}: applies to --participation=srpfl or "
                             "full")
        if not 1 <= pool <= num_clients:
            raise UsageError(f"flag --srpfl_pool={pool}: must be between 1 and "
                             f"--num_clients={num_clients} (the pool is drawn from them)")
    if options["participation"] == "srpfl" and options["initial_participants"] > (
            pool or num_clients):
        raise UsageError(
            f"flag --initial_participants={options['initial_participants']}: must be <= "
            f"{'--srpfl_pool' if pool else '--num_clients'}={pool or num_clients} (SRPFL "
            "picks the fastest n0 of the round's pool)")
    if options["clients_per_round"] > num_clients and options["client_column"] is None:
        raise UsageError(f"flag --clients_per_round={options['clients_per_round']}: must be <= "
                         f"--num_clients={num_clients}")


def _check_optimizers(options: Mapping[str, Any]) -> None:
    for name in ("learning_rate", "server_learning_rate", "dirichlet_alpha"):
        if not (math.isfinite(options[name]) and options[name] > 0):
            raise UsageError(f"flag --{name}={options[name]}: must be a finite number > 0")
    for name, optimizer in (("client_momentum", options["client_optimizer"]),
                            ("server_momentum", options["server_optimizer"])):
        value = options[name]
        if not 0.0 <= value < 1.0:
            raise UsageError(f"flag --{name}={value}: must be in [0, 1)")
        if value and optimizer not in ("sgd", "sgdm"):
            raise UsageError(f"flag --{name}={value}: momentum applies to the sgd and sgdm "
                             f"optimizers only, not {optimizer}")
        if optimizer == "sgdm" and not value > 0:
            raise UsageError(f"flag --{name}={value}: the sgdm optimizer needs a momentum > 0 "
                             "(e.g. 0.5)")
    if not options["weight_decay"] >= 0:
        raise UsageError(f"flag --weight_decay={options['weight_decay']}: must be >= 0")


def check(options: Mapping[str, Any], present: Collection[str] = ()) -> None:
    """Raises `UsageError` naming the first flag of `options` that cannot work.

    `present`: the flags given on the command line (a few checks refuse a flag that was given
    but does nothing for the chosen algorithm).
    """
    algorithm = options["algorithm"]
    unknown = [a for a in algorithm if a not in KERAS_ALGORITHMS]
    if unknown or not algorithm:
        raise UsageError(f"flag --algorithm={','.join(algorithm)}: unknown "
                         f"{', '.join(unknown) or 'empty'}; choose from "
                         f"{', '.join(KERAS_ALGORITHMS)}")
    if len(set(algorithm)) != len(algorithm):
        raise UsageError(f"flag --algorithm={','.join(algorithm)}: names repeat")
    _check_workers(options)
    for name in ("num_clients", "clients_per_round", "rounds", "local_steps", "batch_size",
                 "checkpoint_every", "classes_per_client"):
        _at_least(options, name)
    _at_least(options, "eval_every", minimum=0)
    _check_model(options)
    _check_backbone(options)
    _check_local_work(options, present)
    _check_data(options)
    _check_files(options, present)
    _check_init_adapters(options)
    _check_participation(options)
    _check_optimizers(options)


def output_dir(options: Mapping[str, Any]) -> pathlib.Path:
    """--output_dir, or runs/<task>-<algorithms>-<time> for a new run; created and proved
    writable (`UsageError` otherwise, and for --resume or --evaluate_only without
    --output_dir)."""
    if options["output_dir"]:
        path = pathlib.Path(options["output_dir"])
    elif options["resume"] or options["evaluate_only"]:
        which = "--resume" if options["resume"] else "--evaluate_only"
        raise UsageError(f"flag {which} needs --output_dir naming the run to "
                         f"{'continue' if options['resume'] else 'evaluate'}")
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        algorithm = options["algorithm"]
        name = "-".join(algorithm) if len(algorithm) <= 3 else "compare"
        path = pathlib.Path("runs") / f"{options['task']}-{name}-{stamp}"
    return cli.writable_output_dir(path)
