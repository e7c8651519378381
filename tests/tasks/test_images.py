"""Tests for tasks.images: scaling and shapes against independent parses; malformed CSV errors."""

import gzip
import sys

import numpy as np
import pytest

from tasks import images


def test_digits_scaled_copy_of_sklearn():
    from sklearn import datasets

    raw = datasets.load_digits()
    x, y = images.load_digits()
    assert x.shape == (1797, 64) and x.dtype == np.float32
    assert y.dtype == np.int32
    np.testing.assert_allclose(x * 16.0, raw.data, atol=1e-5)
    np.testing.assert_array_equal(y, raw.target)


def test_mnist_csv_real_file(shared_data):
    path = shared_data / "mnist" / "mnist_5k.csv.gz"
    x, y = images.load_mnist_csv(path)
    assert x.shape == (5000, 784) and x.dtype == np.float32
    np.testing.assert_array_equal(np.bincount(y), np.full(10, 500))
    raw = np.loadtxt(path, delimiter=",", max_rows=3)
    np.testing.assert_allclose(x[:3] * 255.0, raw[:, :784], atol=1e-3)
    np.testing.assert_array_equal(y[:3], raw[:, 784])
    assert 0.0 <= x.min() and x.max() == 1.0


def _write_gz(tmp_path, rows):
    path = tmp_path / "m.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(rows) + "\n")
    return path


def test_mnist_csv_plain_and_gz_agree(tmp_path):
    row = ",".join(["0"] * 783 + ["255", "7"])
    gz = _write_gz(tmp_path, [row, row])
    plain = tmp_path / "m.csv"
    plain.write_text(row + "\n")
    xg, yg = images.load_mnist_csv(gz)
    xp, yp = images.load_mnist_csv(plain)
    assert xg.shape == (2, 784) and xg[0, 783] == 1.0 and xg[0, :783].sum() == 0
    np.testing.assert_array_equal(yg, [7, 7])
    np.testing.assert_array_equal(xp[0], xg[0])
    assert yp.tolist() == [7]


def test_mnist_csv_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent.csv"):
        images.load_mnist_csv(tmp_path / "absent.csv")
    good = ",".join(["0"] * 784 + ["1"])
    with pytest.raises(ValueError, match=r"m\.csv\.gz:2: expected 785 .* got 784"):
        images.load_mnist_csv(_write_gz(tmp_path, [good, ",".join(["0"] * 784)]))
    with pytest.raises(ValueError, match=r"m\.csv\.gz:1: non-numeric field 'x'"):
        images.load_mnist_csv(_write_gz(tmp_path, [",".join(["0"] * 783 + ["x", "1"])]))
    with pytest.raises(ValueError, match=r"row 1: label 12\.0 is not an integer in 0\.\.9"):
        images.load_mnist_csv(_write_gz(tmp_path, [",".join(["0"] * 784 + ["12"])]))
    with pytest.raises(ValueError, match="pixel value outside"):
        images.load_mnist_csv(_write_gz(tmp_path, [",".join(["300"] * 784 + ["1"])]))


def test_mnist_tfds_with_mock_data(tfds):
    with tfds.testing.mock_data(num_examples=12):
        x, y = images.load_mnist_tfds("train")
    assert x.shape == (12, 784) and x.dtype == np.float32
    assert 0.0 <= x.min() and x.max() <= 1.0
    assert y.dtype == np.int32 and set(y) <= set(range(10))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
