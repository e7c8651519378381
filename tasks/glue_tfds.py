"""GLUE classification tasks through TensorFlow Datasets (`glue/<task>`), as `TextExamples`.

| task  | TFDS text features       | classes (TFDS label ids)                       |
|-------|--------------------------|------------------------------------------------|
| sst2  | sentence                 | 0 negative, 1 positive                         |
| qnli  | question, sentence       | 0 entailment, 1 not_entailment                 |
| mnli  | premise, hypothesis      | 0 entailment, 1 neutral, 2 contradiction       |
| qqp   | question1, question2     | 0 not_duplicate, 1 duplicate                   |
| rte   | sentence1, sentence2     | 0 entailment, 1 not_entailment                 |

GLUE's test splits are unlabelled (label −1 in TFDS); those rows are dropped unless
`drop_unlabeled=False`. MNLI's validation splits are "validation_matched" and
"validation_mismatched". Offline, `tfds.testing.mock_data` exercises the same code path.

Example:

>>> ex = load_glue_tfds("sst2", "validation")  # doctest: +SKIP
>>> len(ex)  # doctest: +SKIP
872
"""

from collections.abc import Mapping

import numpy as np

from tasks.text_files import TextExamples

GLUE_TFDS_FEATURES: Mapping[str, tuple[str, ...]] = {
    "sst2": ("sentence",),
    "qnli": ("question", "sentence"),
    "mnli": ("premise", "hypothesis"),
    "qqp": ("question1", "question2"),
    "rte": ("sentence1", "sentence2"),
}


def load_glue_tfds(
    task: str,
    split: str = "train",
    data_dir: str | None = None,
    drop_unlabeled: bool = True,
    download: bool = True,
) -> TextExamples:
    """Load `glue/<task>` split `split` into memory.

    Args:
      task: "sst2", "qnli", "mnli", "qqp" or "rte".
      split: a TFDS split string ("train", "validation", "validation_matched", "train[:10%]", ...).
      data_dir: TFDS data folder (default: TFDS's own).
      drop_unlabeled: drop rows with label −1 (GLUE test splits).
      download: let TFDS download and prepare the data when it is not in `data_dir`.

    Returns:
      TextExamples with the task's text features as segments (UTF-8 decoded) and int32 labels.

    Raises:
      ValueError: unknown task.
    """
    if task not in GLUE_TFDS_FEATURES:
        raise ValueError(
            f"unknown GLUE task {task!r}; expected one of {sorted(GLUE_TFDS_FEATURES)}"
        )
    import tensorflow_datasets as tfds  # local import: TFDS is heavy

    names = GLUE_TFDS_FEATURES[task]
    ds = tfds.load(f"glue/{task}", split=split, data_dir=data_dir, download=download)
    texts: list[list[str]] = [[] for _ in names]
    labels: list[np.ndarray] = []
    for batch in tfds.as_numpy(ds.batch(8192)):
        labels.append(np.asarray(batch["label"]))
        for out, name in zip(texts, names):
            out.extend(t.decode("utf-8") for t in batch[name])
    y = np.concatenate(labels).astype(np.int32) if labels else np.zeros(0, np.int32)
    segments = tuple(np.array(t, dtype=object) for t in texts)
    examples = TextExamples(segments, y, names)
    if drop_unlabeled:
        examples = examples.subset(np.flatnonzero(y >= 0))
    return examples
