"""Digit images as numpy arrays: MNIST (CSV file or TFDS) and scikit-learn's bundled digits.

All loaders return `(x, y)` with x float32 of shape (n, h·w) scaled to [0, 1] and y int32 of
shape (n,), ready for `tasks.partition` and `tasks.client_data.ArrayClientData`.

* `load_mnist_csv(path)`: CSV (optionally gzipped), each row 784 pixel values 0–255 then the label;
  x = pixels / 255, shape (n, 784).
* `load_mnist_tfds(split)`: `tfds.load("mnist")`, same scaling and shape.
* `load_digits()`: `sklearn.datasets.load_digits`, 1,797 8×8 images with values 0–16;
  x = pixels / 16, shape (1797, 64).

Example:

>>> x, y = load_digits()
>>> x.shape, y.shape, float(x.max())
((1797, 64), (1797,), 1.0)
"""

import gzip
import os
import pathlib

import numpy as np

MNIST_PIXELS = 784


def load_mnist_csv(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read MNIST rows `p_1,...,p_784,label` (no header; `.gz` read transparently).

    Args:
      path: the CSV file.

    Returns:
      x float32 (n, 784) in [0, 1], y int32 (n,).

    Raises:
      FileNotFoundError: missing file.
      ValueError: a row without 785 numeric fields, a pixel outside [0, 255] or a label outside
        0..9 (message names file and line).

    Example:

    >>> x, y = load_mnist_csv("../shared/data/mnist/mnist_5k.csv.gz")  # doctest: +SKIP
    >>> x.shape  # doctest: +SKIP
    (5000, 784)
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"MNIST CSV file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt") as f:
        for line_no, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            fields = line.split(",")
            if len(fields) != MNIST_PIXELS + 1:
                raise ValueError(
                    f"{path}:{line_no}: expected {MNIST_PIXELS + 1} comma-separated fields "
                    f"(784 pixels then the label), got {len(fields)}"
                )
            try:
                values = np.array(fields, dtype=np.float64)
            except ValueError:
                bad = next(v for v in fields if not _is_number(v))
                raise ValueError(f"{path}:{line_no}: non-numeric field {bad!r}") from None
            rows.append(values)
    if not rows:
        raise ValueError(f"{path}: no data rows")
    data = np.stack(rows)
    pixels, labels = data[:, :MNIST_PIXELS], data[:, MNIST_PIXELS]
    bad_rows = np.flatnonzero((labels != np.round(labels)) | (labels < 0) | (labels > 9))
    if bad_rows.size:
        r = bad_rows[0]
        raise ValueError(f"{path}: row {r + 1}: label {labels[r]!r} is not an integer in 0..9")
    if pixels.min() < 0 or pixels.max() > 255:
        r = int(np.flatnonzero((pixels < 0).any(1) | (pixels > 255).any(1))[0])
        raise ValueError(f"{path}: row {r + 1}: pixel value outside [0, 255]")
    return (pixels / 255.0).astype(np.float32), labels.astype(np.int32)


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8×8 digits: x float32 (1797, 64) = pixels / 16, y int32 (1797,).

    Example:

    >>> x, y = load_digits()
    >>> np.bincount(y).tolist()[:3]
    [178, 182, 177]
    """
    from sklearn import datasets  # local import: only this loader needs scikit-learn

    bunch = datasets.load_digits()
    return (bunch.data / 16.0).astype(np.float32), bunch.target.astype(np.int32)


def load_mnist_tfds(
    split: str = "train", data_dir: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """MNIST through TFDS (`tfds.load("mnist", split=split)`), flattened and scaled to [0, 1].

    Args:
      split: a TFDS split string, e.g. "train", "test" or "train[:10%]".
      data_dir: TFDS data folder (default: TFDS's own).

    Returns:
      x float32 (n, 784), y int32 (n,).

    Example:

    >>> x, y = load_mnist_tfds("test")  # doctest: +SKIP
    >>> x.shape  # doctest: +SKIP
    (10000, 784)
    """
    import tensorflow_datasets as tfds  # local import: TFDS is heavy and optional here

    ds = tfds.load("mnist", split=split, data_dir=data_dir, as_supervised=True)
    images, labels = [], []
    for image, label in tfds.as_numpy(ds.batch(4096)):
        images.append(image.reshape(len(image), -1))
        labels.append(label)
    x = np.concatenate(images).astype(np.float32) / 255.0
    return x, np.concatenate(labels).astype(np.int32)
