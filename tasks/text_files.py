"""Labelled text from TSV files: GLUE-layout folders and the five-domain review sentiment data.

`read_tsv` reads one headed TSV file into `TextExamples` (one string array per text column, int32
labels). Two quoting conventions:

* `quoting="none"`: GLUE layout, fields are never quoted (a `"` is an ordinary character);
* `quoting="csv"`: fields may be double-quoted and then contain tabs and newlines
  (`csv.reader(..., quotechar='"')`), as in the multi-domain review files.

Malformed input fails loudly: a missing file raises FileNotFoundError naming the path; a missing
column, a row without its label, an empty or non-integer label (or a label outside `label_names`)
raises ValueError naming the file, the line and the offending value.

Example:

>>> ex = read_tsv("sst2/train.tsv", text_columns=("sentence",))  # doctest: +SKIP
>>> len(ex), ex.segments[0][0], int(ex.labels[0])  # doctest: +SKIP
(67349, 'hide new secretions from the parental units ', 0)
"""

import csv
import dataclasses
import os
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class TextExamples:
    """n labelled text examples with one or two segments (e.g. premise and hypothesis).

    Attributes:
      segments: tuple of object arrays of Python str, each of shape (n,).
      labels: int32 array of shape (n,).
      columns: names of the text columns the segments came from.
    """

    segments: tuple[np.ndarray, ...]
    labels: np.ndarray
    columns: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, idx) -> "TextExamples":
        """The examples at indices `idx`."""
        return TextExamples(tuple(s[idx] for s in self.segments), self.labels[idx], self.columns)

    @staticmethod
    def concatenate(parts: Sequence["TextExamples"]) -> "TextExamples":
        """Examples of all `parts` in order (they must have the same number of segments)."""
        num_segments = {len(p.segments) for p in parts}
        if len(num_segments) != 1:
            raise ValueError(f"cannot concatenate examples with {sorted(num_segments)} segments")
        segments = tuple(
            np.concatenate([p.segments[j] for p in parts]) for j in range(num_segments.pop())
        )
        return TextExamples(segments, np.concatenate([p.labels for p in parts]), parts[0].columns)


def _parse_label(value: str, label_names: Sequence[str] | None, where: str) -> int:
    value = value.strip()
    if value == "":
        raise ValueError(f"{where}: empty label")
    if label_names is not None:
        if value not in label_names:
            raise ValueError(f"{where}: label {value!r} is not one of {tuple(label_names)}")
        return list(label_names).index(value)
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{where}: label {value!r} is not an integer") from None


def read_tsv(
    path: str | os.PathLike,
    text_columns: Sequence[str] = ("sentence",),
    label_column: str = "label",
    label_names: Sequence[str] | None = None,
    quoting: str = "none",
) -> TextExamples:
    """Read a headed TSV file of labelled text.

    Args:
      path: the file.
      text_columns: header names of the text column(s), in segment order.
      label_column: header name of the label column.
      label_names: if given, labels are strings mapped to their position in this list; otherwise
        labels must be integers.
      quoting: "none" (GLUE, no quoting) or "csv" (double-quoted fields may span lines).

    Returns:
      TextExamples with one segment per text column.

    Raises:
      FileNotFoundError: `path` does not exist.
      ValueError: missing header column, short row, or bad label (message names file and line).

    Example:

    >>> ex = read_tsv("reviews/books/train.tsv", quoting="csv")  # doctest: +SKIP
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"TSV file not found: {path}")
    if quoting == "none":
        reader_kwargs = dict(delimiter="\t", quoting=csv.QUOTE_NONE)
    elif quoting == "csv":
        reader_kwargs = dict(delimiter="\t", quotechar='"', doublequote=True)
    else:
        raise ValueError(f"quoting must be 'none' or 'csv', got {quoting!r}")
    csv.field_size_limit(1 << 30)
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, **reader_kwargs)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty file (expected a header line)")
        header = [h.strip() for h in header]
        missing = [c for c in (*text_columns, label_column) if c not in header]
        if missing:
            raise ValueError(f"{path}: header {header} lacks column(s) {missing}")
        text_pos = [header.index(c) for c in text_columns]
        label_pos = header.index(label_column)
        needed = max(*text_pos, label_pos) + 1
        texts: list[list[str]] = [[] for _ in text_columns]
        labels: list[int] = []
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if not row or (len(row) == 1 and row[0].strip() == ""):
                continue  # blank line
            if len(row) < needed:
                raise ValueError(
                    f"{where}: row has {len(row)} field(s), expected {len(header)} "
                    f"(missing {header[len(row):needed]}); row starts {row[0][:40]!r}"
                )
            labels.append(_parse_label(row[label_pos], label_names, where))
            for seg, pos in zip(texts, text_pos):
                seg.append(row[pos])
    return TextExamples(
        tuple(np.array(seg, dtype=object) for seg in texts),
        np.array(labels, dtype=np.int32),
        tuple(text_columns),
    )


@dataclasses.dataclass(frozen=True)
class GlueTsvSpec:
    """Column layout of one GLUE task's TSV files (label ids follow TFDS `glue/*`)."""

    text_columns: tuple[str, ...]
    label_column: str
    label_names: tuple[str, ...] | None
    splits: tuple[str, ...]


# Original GLUE layouts (plus the labelled SST-2 test copy in ../shared/data/sst2).
GLUE_TSV_SPECS: Mapping[str, GlueTsvSpec] = {
    "sst2": GlueTsvSpec(("sentence",), "label", None, ("train", "dev", "test-labeled")),
    "qnli": GlueTsvSpec(
        ("question", "sentence"), "label", ("entailment", "not_entailment"), ("train", "dev")
    ),
    "rte": GlueTsvSpec(
        ("sentence1", "sentence2"), "label", ("entailment", "not_entailment"), ("train", "dev")
    ),
    "mnli": GlueTsvSpec(
        ("sentence1", "sentence2"),
        "gold_label",
        ("entailment", "neutral", "contradiction"),
        ("train", "dev_matched", "dev_mismatched"),
    ),
    "qqp": GlueTsvSpec(("question1", "question2"), "is_duplicate", None, ("train", "dev")),
}

GLUE_NUM_CLASSES = {"sst2": 2, "qnli": 2, "rte": 2, "mnli": 3, "qqp": 2}


def load_glue_tsv(
    directory: str | os.PathLike, task: str = "sst2", splits: Sequence[str] | None = None
) -> dict[str, TextExamples]:
    """Load a GLUE-layout folder (`<split>.tsv`, headed, unquoted).

    Args:
      directory: folder holding e.g. train.tsv and dev.tsv.
      task: one of GLUE_TSV_SPECS ("sst2", "qnli", "rte", "mnli", "qqp").
      splits: split names to load; by default the task's standard splits that exist on disk
        (train must exist).

    Returns:
      dict split name -> TextExamples.

    Raises:
      FileNotFoundError: the folder, train.tsv or a requested split file is missing.

    Example:

    >>> data = load_glue_tsv("../shared/data/sst2")  # doctest: +SKIP
    >>> sorted(data), len(data["train"])  # doctest: +SKIP
    (['dev', 'test-labeled', 'train'], 67349)
    """
    if task not in GLUE_TSV_SPECS:
        raise ValueError(f"unknown GLUE task {task!r}; expected one of {sorted(GLUE_TSV_SPECS)}")
    spec = GLUE_TSV_SPECS[task]
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"GLUE folder not found: {directory}")
    if splits is None:
        splits = [s for s in spec.splits if s == "train" or (directory / f"{s}.tsv").is_file()]
    return {
        s: read_tsv(
            directory / f"{s}.tsv", spec.text_columns, spec.label_column, spec.label_names, "none"
        )
        for s in splits
    }


REVIEW_DOMAINS = ("airline", "books", "dvd", "electronics", "kitchen")
REVIEW_SPLITS = ("train", "dev", "test-labeled")


def load_review_domains(
    root: str | os.PathLike,
    domains: Sequence[str] = REVIEW_DOMAINS,
    splits: Sequence[str] = REVIEW_SPLITS,
) -> dict[str, dict[str, TextExamples]]:
    """Load the multi-domain review sentiment data: `<root>/<domain>/<split>.tsv` (quoted TSV).

    Args:
      root: folder with one sub-folder per domain.
      domains: domains to load.
      splits: splits to load from each domain.

    Returns:
      dict domain -> dict split -> TextExamples (single segment "sentence", labels 0/1).

    Example:

    >>> data = load_review_domains("../shared/data/multidomain_sentiment")  # doctest: +SKIP
    >>> len(data["books"]["train"])  # doctest: +SKIP
    1700
    """
    root = pathlib.Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"review data folder not found: {root}")
    return {
        d: {
            s: read_tsv(root / d / f"{s}.tsv", ("sentence",), "label", quoting="csv")
            for s in splits
        }
        for d in domains
    }
