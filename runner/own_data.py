"""A user's `tff.simulation.datasets.ClientData` as a run: the one typed path from data in Python to
a federated run, its table and plot.

`config_from_client_data(client_data, output_dir, ...)` writes the clients' examples to
`<output_dir>/data/train.jsonl` (one row per example with its `client_id`; the dev examples, if
given, to `dev.jsonl`) and returns the `runner.run_config.RunConfig` of a run on them: the
task `text` for (text, label) examples, `instruct` for (prompt, response) ones, each client its
own (`client_column="client_id"`). `runner.run.execute(config)` then runs it as
`scripts/train.py` would, with the comparison table and plot, and `--resume` and `--config`
work on it as on any run, since the data it names stays in the run folder.

An example is a mapping with `text` and `label` (and optionally `text_pair`, for sentence
pairs), with `prompt` and `response`, or with Alpaca's `instruction`, `input` and `output`; or a
pair `(text, label)`. Labels may be integers or strings.

A run of FedAvg-LoRA on two clients' reviews, in a few lines:

>>> import tensorflow_federated as tff
>>> from runner.run import execute
>>> client_data = tff.simulation.datasets.TestClientData({
...     "ann": {"text": ["a joy to watch", "dull and slow", "great fun"],
...             "label": ["pos", "neg", "pos"]},
...     "bob": {"text": ["a waste of time", "warm and witty", "painfully long"],
...             "label": ["neg", "pos", "neg"]}})
>>> config = config_from_client_data(client_data, str(run_dir / "mine"), backbone="tiny",
...                                  algorithm=["fedavg_lora"], rounds=1, local_steps=1)
>>> execute(config, script="example")   # doctest: +ELLIPSIS
tffl: fetching all-MiniLM-L6-v2's vocabulary and weights (downloaded once) ...
tffl: reading .../mine/data/train.jsonl ...
tffl: fedavg_lora on train.jsonl (5 train examples, 2 clients, 2 classes; tiny random BERT ...
round 1/1  loss ...
done: fedavg_lora 1 communication round; train loss ...; dev loss ..., dev accuracy ...
Results in .../mine
0
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from typing import Any

from runner.run_config import RunConfig

CLIENT_COLUMN = "client_id"
DATA_FOLDER = "data"
# The example forms, by their keys: the task each makes and the keys a row keeps.
FORMS = (("text", ("text", "label")), ("instruct", ("prompt", "response")),
         ("instruct", ("instruction", "output")))


def _text(value) -> Any:
    value = value.item() if hasattr(value, "item") else value
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _rows(dataset, client_id: str | None) -> list[dict]:
    """Each example of `dataset` as a JSON-ready row (with its client when given)."""
    rows = []
    for element in dataset.as_numpy_iterator():
        if isinstance(element, Mapping):
            row = {str(k): _text(v) for k, v in element.items()}
        elif isinstance(element, tuple) and len(element) == 2:
            row = {"text": _text(element[0]), "label": _text(element[1])}
        else:
            raise ValueError(f"client {client_id!r}: an example is a {type(element).__name__}; "
                             "give mappings with text and label (or prompt and response), or "
                             "(text, label) pairs")
        if client_id is not None:
            row[CLIENT_COLUMN] = client_id
        rows.append(row)
    return rows


def _task_of(row: Mapping) -> str:
    for task, keys in FORMS:
        if all(k in row for k in keys):
            return task
    raise ValueError(f"an example has the keys {', '.join(sorted(row))}; give text and label "
                     "(or prompt and response, or instruction and output)")


def _write(path: pathlib.Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def config_from_client_data(client_data, output_dir: str, dev=None, **changes) -> RunConfig:
    """The `RunConfig` of a run on `client_data`'s clients (module docstring), into `output_dir`.

    Args:
      client_data: a `tff.simulation.datasets.ClientData` of (text, label) or (prompt, response)
        examples.
      output_dir: the run folder; the examples go to its `data/` folder.
      dev: the examples evaluated every `eval_every` rounds: a `ClientData` or a
        `tf.data.Dataset` of the same examples; None holds a tenth of the training rows out.
      **changes: `RunConfig` fields by their flag names (e.g. `backbone="minilm"`,
        `algorithm=["rolora", "fedavg_lora"]`, `rounds=50`). `clients_per_round` defaults to
        all clients, at most `RunConfig`'s default.

    Raises:
      ValueError: an example of another form, or clients without examples.
    """
    folder = pathlib.Path(output_dir) / DATA_FOLDER
    rows = [row for cid in client_data.client_ids
            for row in _rows(client_data.create_tf_dataset_for_client(cid), cid)]
    if not rows:
        raise ValueError("client_data has no examples")
    task = _task_of(rows[0])
    fields = {"task": task, "train_file": _write(folder / "train.jsonl", rows),
              "client_column": CLIENT_COLUMN, "output_dir": str(output_dir)}
    if task == "text" and "text_pair" in rows[0]:
        fields["text_pair_column"] = "text_pair"
    if dev is not None:
        if hasattr(dev, "client_ids"):
            dev_rows = [row for cid in dev.client_ids
                        for row in _rows(dev.create_tf_dataset_for_client(cid), cid)]
        else:
            dev_rows = _rows(dev, None)
        fields["dev_file"] = _write(folder / "dev.jsonl", dev_rows)
    default = RunConfig().participation.clients_per_round
    fields["clients_per_round"] = min(default, len(client_data.client_ids))
    return RunConfig().with_changes(**{**fields, **changes})
