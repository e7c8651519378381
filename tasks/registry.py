"""Task names -> `RunTask`s: a model, its clients and their per-round data, and an evaluator.

`build_task("sst2", ...)` is what `--task=sst2` (with the backbone, partition and batching flags)
becomes. The algorithm side (`--algorithm`, optimizers, samplers, evaluators) is
`experiments/algorithms.py`. Dependencies point one way: tasks -> models, tasks -> tffl.

Here: the task builders by name, and the flat-feature (image) tasks' models (`MODELS`). `RunTask`
and the dataset helpers are `tasks.run_task`; the text tasks are `tasks.text_run_task`. Their
names stay importable from here.
"""

from __future__ import annotations

import contextlib
import io
import pathlib

import numpy as np
import tensorflow as tf

with contextlib.redirect_stdout(io.StringIO()):  # keras_core prints "Using TensorFlow backend"
    import keras_nlp  # noqa: F401  (imported by the tasks' modules below)

from tasks.run_task import (  # noqa: F401  (re-exported: they used to live here)
    _SHUFFLE_BUFFER,
    RunTask,
    _client_dataset_fn,
    _client_eval_data,
    _materialized,
    _ordered,
    _size,
    _train_size,
    counted,
)
from tasks.text_run_task import (  # noqa: F401  (re-exported: they used to live here)
    BACKBONES,
    RANDOM_BACKBONE_MAX_LENGTH,
    RANDOM_BACKBONE_POOLING,
    TEXT_TASKS,
    _round_storage,
    _text_run_task,
    announce,
    default_max_length,
    default_pooling,
)
from models.decoders import DECODERS
from tasks.instruct_run_task import INSTRUCT_TASKS, _instruct_run_task
from tffl.simulation import evaluation

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
        raise ValueError(f"rank={rank}: must be between 1 and the input width {input_dim}")

    def keras_model_fn() -> tf.keras.Model:
        if lora:
            return paper_models.build_rolora_mnist_net(paper_models.RoloraMnistNetConfig(
                input_dim=input_dim, rank=rank, num_classes=task.num_classes, seed=seed,
                b_stddev=LORA_NET_B_STDDEV, base_kernel=model == "lora_net_base",
                trainable_head=model == "lora_head_net",
            ))
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
        description=f"{task.name} ({_train_size(task)} train examples, "
        f"{counted(len(task.train_data.client_ids), 'client')}; {shape})",
        client_ids=list(task.train_data.client_ids),
        client_dataset_fn=_client_dataset_fn(task.train_data, batch_size, local_steps, seed),
        keras_model_fn=keras_model_fn,
        input_spec=input_spec,
        evaluate=evaluation.make_keras_evaluator(keras_model_fn, task.global_test_data.batch(256)),
        client_eval_data=_client_eval_data(task, batch_size),
        global_test_size=_size(task.global_test_data),
    )


def _scheme_kwargs(partition: str, classes_per_client: int, dirichlet_alpha: float) -> dict:
    """The keyword arguments of the `partition` scheme (`tasks.partition`) among these."""
    if partition == "shards":
        return {"classes_per_client": classes_per_client}
    if partition == "dirichlet":
        return {"alpha": dirichlet_alpha}
    return {}


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


def _digits_task(num_clients, seed, partition, data_dir, **kw):
    """scikit-learn's 8x8 digits (no `data_dir`), and the MLP's hidden width for it."""
    from tasks import task as task_lib

    del data_dir
    return task_lib.digits_task(num_clients, scheme=partition, seed=seed,
                                **_scheme_kwargs(partition, **kw)), 32


def _mnist_task(num_clients, seed, partition, data_dir, **kw):
    """MNIST from TFDS (`data_dir` None) or `data_dir`'s 5k CSV, and the MLP's hidden width."""
    from tasks import task as task_lib

    if data_dir is None:   # TFDS's `mnist` (downloaded once into TFDS's folder)
        return task_lib.mnist_tfds_task(num_clients, scheme=partition, seed=seed,
                                        **_scheme_kwargs(partition, **kw)), 200
    path = pathlib.Path(data_dir) / "mnist" / "mnist_5k.csv.gz"
    return task_lib.mnist_csv_task(path, num_clients, scheme=partition, seed=seed,
                                   **_scheme_kwargs(partition, **kw)), 200


_TASK_BUILDERS = {"digits": _digits_task, "mnist": _mnist_task}
TASKS = (*_TASK_BUILDERS, *TEXT_TASKS, *INSTRUCT_TASKS)
# The text tasks' encoders (`tasks.text_run_task`), then the instruction tasks' decoders.
BACKBONES = (*BACKBONES, *DECODERS)
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
    and `eval_test` as in `tasks.text_run_task._text_run_task`)."""
    if partition not in PARTITIONS:
        raise ValueError(f"unknown partition {partition!r}; choose one of {', '.join(PARTITIONS)}")
    if name in INSTRUCT_TASKS:
        return _instruct_run_task(
            name, num_clients, batch_size, local_steps, seed, partition, data_dir, backbone,
            rank, lora_alpha, tuple(lora_targets), lora_layers, sequence_length,
            _scheme_kwargs(partition, classes_per_client, dirichlet_alpha),
            bucket_by_length=bucket_by_length)
    if name in TEXT_TASKS:
        return _text_run_task(
            name, num_clients, batch_size, local_steps, seed, partition, data_dir, backbone,
            rank, lora_alpha, tuple(lora_targets), lora_layers, sequence_length,
            _scheme_kwargs(partition, classes_per_client, dirichlet_alpha),
            classifier=(pooling, head),
            prefix_cache=prefix_cache, bucket_by_length=bucket_by_length,
            rounds_on_disk=rounds_on_disk, eval_test=eval_test)
    if eval_test:
        raise ValueError(f"eval_test=True: only task 'sst2' has a labeled test split beside "
                         f"the dev set it evaluates on, not {name!r}")
    if name not in _TASK_BUILDERS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    task, hidden = _TASK_BUILDERS[name](
        num_clients, seed, partition, data_dir,
        classes_per_client=classes_per_client, dirichlet_alpha=dirichlet_alpha,
    )
    if not 0.0 <= shortcut_alpha <= 1.0:
        raise ValueError(f"shortcut_alpha={shortcut_alpha}: must be in [0, 1]")
    return _run_task(task, hidden, batch_size, local_steps, seed, model=model, rank=rank,
                     shortcut_alpha=shortcut_alpha)
