"""Task names -> `RunTask`s: a model, its clients and their per-round data, and an evaluator.

`build_run_task(spec)` is what `--task` (with the data, backbone, partition and batching flags)
becomes, for a `tasks.task_config.TaskSpec`. The algorithm side (`--algorithm`, optimizers,
samplers, evaluators) is `runner/algorithms.py`. Dependencies point one way: tasks ->
models, tasks -> tffl.

Here: the task builders by name, and the flat-feature (image) tasks' models (`MODELS`). `RunTask`
and the dataset helpers are `tasks.run_task`; the text classification tasks are
`tasks.text_run_task`, the instruction tasks `tasks.instruct_run_task`.

>>> from tasks.task_config import TaskSpec
>>> spec = TaskSpec().with_changes(task="digits", num_clients=3, partition="iid", local_steps=2)
>>> task = build_run_task(spec)
>>> task.client_ids
['client_000', 'client_001', 'client_002']
>>> task.description
'digits (1438 train examples, 3 clients; MLP 64-32-10)'
"""

from __future__ import annotations

import contextlib
import io
import pathlib

import tensorflow as tf

with contextlib.redirect_stdout(io.StringIO()):  # keras_core prints "Using TensorFlow backend"
    import keras_nlp  # noqa: F401  (imported by the tasks' modules below)

from models.decoders import DECODERS
from tasks import instruct_run_task
from tasks import text_run_task
from tasks.run_task import RunTask
from tasks.run_task import client_dataset_fn
from tasks.run_task import client_eval_data_fn
from tasks.run_task import counted
from tasks.run_task import dataset_size
from tasks.run_task import scheme_kwargs
from tasks.run_task import train_size
from tasks.task_config import TaskSpec
from tffl.simulation import evaluation

# lora_net_base adds a frozen (zero) base kernel W0 linked to the adapter, for FLoRA to merge into.
# pfl_mlp / pfl_mlp_lg: x -> hidden -> hidden/2 -> classes with FedRep's split (last layer `head`)
# or LG-FedAvg's (first layer local, tagged `head`); lora_head_net: the LoRA net with a trainable
# `head` output layer (personalization over a LoRA representation).
# pfl_mlp_shortcut: pfl_mlp plus AdaptPFL's personal shortcut x -> logits mixed with weight α.
MODELS = ("mlp", "lora_net", "lora_net_base", "pfl_mlp", "pfl_mlp_lg", "pfl_mlp_shortcut",
          "lora_head_net")
LORA_NET_B_STDDEV = 1e-3


def _run_task(task, hidden: int, spec: TaskSpec) -> RunTask:
    """Wraps a `tasks.task.Task` of flat features with the model `spec.net` for the round loop.

    `net="mlp"`: x -> ReLU(x W1 + b1) W2 + b2 (all trainable, for FedAvg).
    `net="lora_net"`: RoLoRA's two-layer net logits = ReLU(x A B) W_out (A: d x rank, B: rank x
    d, W_out fixed), with B initialized N(0, 1e-3^2) instead of the paper's 0 because ReLU'(0) = 0
    would leave every gradient exactly zero (see models.paper_models.build_rolora_mnist_net).
    """
    from models import paper_models

    model, rank, seed = spec.net, spec.model.adapter_rank, spec.seed
    shortcut_alpha = spec.shortcut_alpha
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
                trainable_head=model == "lora_head_net"))
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
    batch_size = spec.task.batch_size
    return RunTask(
        description=f"{task.name} ({train_size(task)} train examples, "
        f"{counted(len(task.train_data.client_ids), 'client')}; {shape})",
        client_ids=list(task.train_data.client_ids),
        client_dataset_fn=client_dataset_fn(task.train_data, batch_size, spec.local_steps, seed),
        keras_model_fn=keras_model_fn,
        input_spec=input_spec,
        evaluate=evaluation.make_keras_evaluator(keras_model_fn, task.global_test_data.batch(256)),
        client_eval_data=client_eval_data_fn(task, batch_size),
        global_test_size=dataset_size(task.global_test_data),
    )


def _digits_task(spec: TaskSpec):
    """scikit-learn's 8x8 digits (no `data_dir`), and the MLP's hidden width for it."""
    from tasks import task as task_lib

    t = spec.task
    return task_lib.digits_task(t.num_clients, scheme=t.partition, seed=spec.seed,
                                **scheme_kwargs(t)), 32


def _mnist_task(spec: TaskSpec):
    """MNIST from TFDS (`data_dir` None) or `data_dir`'s 5k CSV, and the MLP's hidden width."""
    from tasks import task as task_lib

    t = spec.task
    if t.data_dir is None:   # TFDS's `mnist` (downloaded once into TFDS's folder)
        return task_lib.mnist_tfds_task(t.num_clients, scheme=t.partition, seed=spec.seed,
                                        **scheme_kwargs(t)), 200
    path = pathlib.Path(t.data_dir) / "mnist" / "mnist_5k.csv.gz"
    return task_lib.mnist_csv_task(path, t.num_clients, scheme=t.partition, seed=spec.seed,
                                   **scheme_kwargs(t)), 200


_TASK_BUILDERS = {"digits": _digits_task, "mnist": _mnist_task}
TASKS = (*_TASK_BUILDERS, *text_run_task.TEXT_TASKS, *instruct_run_task.INSTRUCT_TASKS)
# The text tasks' encoders (`tasks.text_run_task`), then the instruction tasks' decoders.
BACKBONES = (*text_run_task.BACKBONES, *DECODERS)
PARTITIONS = ("iid", "shards", "dirichlet")


def build_run_task(spec: TaskSpec) -> RunTask:
    """The task `spec.task.task` with the model `spec.net` (image tasks), a LoRA classifier on
    `spec.model.backbone` (text classification tasks) or a decoder with LoRA (instruction
    tasks). `spec.task.data_dir`: a folder laid out as ../shared/data (mnist/mnist_5k.csv.gz,
    sst2/*.tsv, multidomain_sentiment/); None loads `mnist` and `sst2` through TFDS (`mnist`,
    `glue/sst2`; `reviews` has no TFDS source). `text` and `instruct` read the user's files or
    TFDS dataset (`tasks.task_config.TaskConfig`).

    Raises:
      ValueError: an unknown task or partition, or a value the task cannot use (named).
    """
    name = spec.task.task
    if spec.task.partition not in PARTITIONS:
        raise ValueError(f"unknown partition {spec.task.partition!r}; choose one of "
                         f"{', '.join(PARTITIONS)}")
    if name in instruct_run_task.INSTRUCT_TASKS:
        return instruct_run_task.instruct_run_task(spec)
    if name in text_run_task.TEXT_TASKS:
        return text_run_task.text_run_task(spec)
    if spec.eval_test:
        raise ValueError(f"eval_test=True: task {name!r} has no held-out test split beside the "
                         "split it evaluates on")
    if name not in _TASK_BUILDERS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    task, hidden = _TASK_BUILDERS[name](spec)
    if not 0.0 <= spec.shortcut_alpha <= 1.0:
        raise ValueError(f"shortcut_alpha={spec.shortcut_alpha}: must be in [0, 1]")
    return _run_task(task, hidden, spec)
