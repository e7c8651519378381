"""Labelled text of any TensorFlow Datasets dataset by name, as `tasks.data_files.TextRows`.

`load_text_rows(name, split, columns)` loads `tfds.load(name, split=split)` (TFDS's own download
and data folder) and reads the features `columns` names: the text, an optional second text, the
label and an optional client. A `ClassLabel` label is kept as its class name, so the task orders
and encodes it like the labels of a file (`tasks.data_files.label_names`); any other label is
written as text. Offline, `tfds.testing.mock_data` exercises the same path:

>>> import tensorflow_datasets as tfds
>>> from tasks.data_files import TextColumns
>>> with tfds.testing.mock_data(num_examples=6):
...     rows = load_text_rows("imdb_reviews", "train", TextColumns())
>>> len(rows), sorted(set(rows.labels.tolist())) <= ["neg", "pos"], rows.lines.tolist()[:2]
(6, True, [1, 2])
"""

from __future__ import annotations

import pathlib

import numpy as np

from tasks.data_files import TextColumns
from tasks.data_files import TextRows


def _as_text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def load_text_rows(name: str, split: str, columns: TextColumns) -> TextRows:
    """Split `split` of the TFDS dataset `name` as labelled text rows; a row's "line" is its
    position in the split, from 1.

    Raises:
      ValueError: one line naming the dataset: a feature it does not have (with its features),
        an unknown dataset or split (TFDS's own message), or a split without rows.
    """
    import tensorflow_datasets as tfds  # local import: TFDS is heavy

    where = f"tfds:{name}[{split}]"
    try:
        dataset, info = tfds.load(name, split=split, with_info=True)
    except (tfds.core.registered.DatasetNotFoundError, ValueError, KeyError) as e:
        raise ValueError(f"{where}: {str(e).splitlines()[0]}") from None
    features = info.features
    missing = [c for c in columns.names if c not in features]
    if missing:
        flag = {columns.text: "text_column", columns.pair: "text_pair_column",
                columns.label: "label_column", columns.client: "client_column"}[missing[0]]
        raise ValueError(f"{where}: no feature {missing[0]!r} (its features: "
                         f"{', '.join(features)}); name it with {flag}=<one of them>")
    label_feature = features[columns.label]
    class_names = getattr(label_feature, "names", None)
    fields: dict[str, list[str]] = {c: [] for c in columns.names}
    for batch in tfds.as_numpy(dataset.batch(4096)):
        for column in columns.names:
            values = batch[column]
            if column == columns.label and class_names is not None:
                fields[column].extend(class_names[int(v)] if v >= 0 else "" for v in values)
            else:
                fields[column].extend(_as_text(v) for v in values)
    kept = np.array([label != "" for label in fields[columns.label]], bool)  # unlabelled: -1
    if not kept.any():
        raise ValueError(f"{where}: no labelled rows")
    texts = tuple(np.array(fields[c], dtype=object)[kept]
                  for c in (columns.text, columns.pair) if c)
    clients = (np.array(fields[columns.client], dtype=object)[kept] if columns.client else None)
    return TextRows(pathlib.Path(where), texts, np.array(fields[columns.label], dtype=object)[kept],
                    clients, np.flatnonzero(kept).astype(np.int64) + 1, columns)
