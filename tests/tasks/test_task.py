"""Tests for tasks.task: Task assembly per scheme, per-client test labels, real data tasks."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from tasks import task as task_lib


def _labels(cd, cid):
    return np.array([int(y) for _, y in cd.create_tf_dataset_for_client(cid)])


def test_holdout_split_is_stratified_and_disjoint():
    y = np.repeat(np.arange(3), [10, 20, 30])
    tr, te = task_lib.holdout_split(y, 0.3, seed=1)
    assert len(np.intersect1d(tr, te)) == 0 and len(tr) + len(te) == 60
    np.testing.assert_array_equal(np.bincount(y[te]), [3, 6, 9])
    with pytest.raises(ValueError, match="test_fraction"):
        task_lib.holdout_split(y, 1.5)


def test_digits_task_shards_personal_test_sets():
    t = task_lib.digits_task(num_clients=10, scheme="shards", classes_per_client=2, seed=0)
    assert t.name == "digits" and t.num_classes == 10 and t.model_fn is None
    assert t.element_spec[0].shape == (64,) and t.element_spec[1].dtype == tf.int32
    assert len(t.train_data.client_ids) == 10
    total = 0
    for cid in t.train_data.client_ids:
        train_classes = set(_labels(t.train_data, cid))
        assert len(train_classes) == 2
        total += t.info["train_sizes"][cid]
        if cid in t.test_data.client_ids:
            assert set(_labels(t.test_data, cid)) <= train_classes
    assert total == 1797 - int(t.global_test_data.cardinality())
    assert int(t.global_test_data.cardinality()) == sum(t.info["test_sizes"].values())
    np.testing.assert_array_equal((t.info["train_label_counts"] > 0).sum(1), np.full(10, 2))


def test_build_task_iid_and_dirichlet_and_model_slot():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 4)).astype(np.float32)
    y = np.arange(300) % 3
    t = task_lib.build_task("toy", task_lib.Examples(x, y), task_lib.Examples(x[:90], y[:90]),
                            task_lib.Partitioning(3, num_clients=5, scheme="dirichlet",
                                                  options={"alpha": 0.2}, seed=3))
    assert t.info["alpha"] == 0.2 and t.info["scheme"] == "dirichlet"
    assert sum(t.info["train_sizes"].values()) == 300
    counts = t.info["train_label_counts"]
    test_counts = np.array([np.bincount(_labels(t.test_data, c), minlength=3)
                            if c in t.test_data.client_ids else np.zeros(3, int)
                            for c in t.train_data.client_ids])
    # Per-client test counts = 30 * n_ic / 100 up to rounding (class totals 100 train, 30 test).
    np.testing.assert_array_less(np.abs(test_counts - 0.3 * counts), 1.0)
    t.model_fn = lambda: tf.keras.Sequential([tf.keras.layers.Dense(3)])
    model = t.model_fn()
    (bx, _), = t.train_data.create_tf_dataset_for_client("client_000").batch(1000)
    assert model(bx).shape == (len(bx), 3)
    with pytest.raises(ValueError, match="needs num_clients"):
        task_lib.build_task("toy", task_lib.Examples(x, y), task_lib.Examples(x, y),
                            task_lib.Partitioning(3))


def test_build_task_natural_groups():
    x = np.arange(12, dtype=np.float32)[:, None]
    y = np.arange(12) % 2
    groups = np.array(["a"] * 4 + ["b"] * 8)
    test_groups = np.array(["b"] * 6 + ["a"] * 6)
    t = task_lib.build_task("g", task_lib.Examples(x, y, groups),
                            task_lib.Examples(x, y, test_groups), task_lib.Partitioning(2))
    assert t.train_data.client_ids == ["a", "b"]
    xs = [float(v[0]) for v, _ in t.test_data.create_tf_dataset_for_client("a")]
    assert xs == [6, 7, 8, 9, 10, 11]
    with pytest.raises(ValueError, match="train groups give clients"):
        task_lib.build_task("g", task_lib.Examples(x, y, groups),
                            task_lib.Examples(x, y, np.array(["c"] * 12)),
                            task_lib.Partitioning(2))


def test_mnist_csv_task(shared_data):
    t = task_lib.mnist_csv_task(shared_data / "mnist" / "mnist_5k.csv.gz", num_clients=20,
                                scheme="shards", classes_per_client=2, seed=0)
    assert int(t.global_test_data.cardinality()) == 1000
    assert sum(t.info["train_sizes"].values()) == 4000
    assert set(t.info["train_sizes"].values()) == {200}


def test_review_task_real_domains(shared_data, tf_text):
    from tasks import text

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "the", "book"]
    t = task_lib.review_task(shared_data / "multidomain_sentiment", text.bert_packer(vocab, 16),
                             clients_per_domain=2, domains=("books", "kitchen"))
    assert t.train_data.client_ids == ["books_0", "books_1", "kitchen_0", "kitchen_1"]
    assert t.info["train_sizes"] == {"books_0": 850, "books_1": 850, "kitchen_0": 850,
                                     "kitchen_1": 850}
    assert t.info["test_sizes"] == {c: 1000 for c in t.train_data.client_ids}
    assert int(t.global_test_data.cardinality()) == 4000
    x, y = next(iter(t.train_data.create_tf_dataset_for_client("kitchen_1").batch(8)))
    assert x["token_ids"].shape == (8, 16) and x["segment_ids"].shape == (8, 16)
    assert y.dtype == tf.int32


@pytest.mark.large
def test_sst2_whole_train_set_50_clients(shared_data, tf_text):
    from tasks import benchmark_text, text, text_files

    dev = text_files.load_glue_tsv(shared_data / "sst2", "sst2", splits=("dev",))["dev"]
    packer = text.bert_packer(benchmark_text.frequency_vocabulary(dev.segments[0], 2000), 24)
    t = task_lib.sst2_tsv_task(shared_data / "sst2", packer, num_clients=50, scheme="dirichlet",
                               alpha=0.5, seed=0)
    assert len(t.train_data.client_ids) == 50
    assert sum(t.info["train_sizes"].values()) == 67349
    assert min(t.info["train_sizes"].values()) >= 1
    assert int(t.global_test_data.cardinality()) == 872
    x, y = next(iter(t.train_data.create_tf_dataset_for_client("client_007").batch(4)))
    assert {k: tuple(v.shape) for k, v in x.items()} == {
        "token_ids": (4, 24), "segment_ids": (4, 24), "padding_mask": (4, 24)}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
