"""Tests for tasks.partition: sizes, class structure, Dirichlet limits, determinism, errors."""

import sys

import numpy as np
import pytest

from tasks import partition, partition_schemes

LABELS = np.repeat(np.arange(10), 60)  # 600 examples, 60 per class


def _assert_disjoint_cover(parts, n):
    all_idx = np.concatenate(list(parts.values()))
    assert len(all_idx) == n
    np.testing.assert_array_equal(np.sort(all_idx), np.arange(n))
    assert all(len(v) > 0 for v in parts.values())


def test_iid_sizes_and_cover():
    parts = partition_schemes.iid(LABELS, num_clients=7, seed=3)
    _assert_disjoint_cover(parts, 600)
    sizes = sorted(len(v) for v in parts.values())
    # 600 = 7 * 85 + 5: five clients of 86, two of 85.
    assert sizes == [85, 85, 86, 86, 86, 86, 86]
    assert list(parts) == [f"client_{i:03d}" for i in range(7)]


def test_iid_is_roughly_label_balanced():
    labels = np.repeat(np.arange(2), 5000)
    parts = partition_schemes.iid(labels, 4, seed=0)
    for idx in parts.values():
        # Hypergeometric: sd of the positive fraction ~ sqrt(.25/2500) = 0.01.
        assert abs(labels[idx].mean() - 0.5) < 0.05


@pytest.mark.parametrize("num_clients,k", [(20, 2), (10, 3), (7, 10), (5, 1)])
def test_shards_give_exactly_k_classes(num_clients, k):
    parts = partition_schemes.shards(LABELS, num_clients, classes_per_client=k, seed=1)
    counts = partition.label_counts(LABELS, parts, 10)
    used = np.flatnonzero(counts.sum(axis=0) > 0)
    assert len(used) == min(10, num_clients * k)
    # Disjoint, and together they hold every example of the classes in use.
    all_idx = np.concatenate(list(parts.values()))
    np.testing.assert_array_equal(np.sort(all_idx), np.flatnonzero(np.isin(LABELS, used)))
    np.testing.assert_array_equal((counts > 0).sum(axis=1), np.full(num_clients, k))
    # Every class is held by floor(Nk/C) or ceil(Nk/C) clients.
    holders = (counts > 0).sum(axis=0)
    assert holders.min() >= (num_clients * k) // 10
    assert holders.max() <= -(-(num_clients * k) // 10)
    # Within a class, shards are equal up to one example.
    for c in used:
        sizes = counts[:, c][counts[:, c] > 0]
        assert sizes.max() - sizes.min() <= 1


def test_shards_fedrep_layout_equal_client_sizes():
    # FedRep: 100 clients, 5 shards each, 10 classes with 500 examples -> 50 shards of 10 per class.
    labels = np.repeat(np.arange(10), 500)
    parts = partition_schemes.shards(labels, 100, 5, seed=0)
    assert {len(v) for v in parts.values()} == {50}


def test_shards_errors():
    with pytest.raises(ValueError, match="classes_per_client=11"):
        partition_schemes.shards(LABELS, 5, classes_per_client=11)
    tiny = np.array([0, 0, 1, 1])
    with pytest.raises(ValueError, match="class 0 has 2 examples but must be cut into 3 shards"):
        partition_schemes.shards(tiny, 3, classes_per_client=2)


def _client_distributions(labels, parts, num_classes):
    counts = partition.label_counts(labels, parts, num_classes).astype(float)
    return counts / counts.sum(axis=1, keepdims=True)


def test_dirichlet_small_alpha_concentrates_each_class_on_one_client():
    labels = np.repeat(np.arange(10), 200)
    parts = partition_schemes.dirichlet(labels, num_clients=10, alpha=1e-3, seed=0)
    _assert_disjoint_cover(parts, 2000)
    counts = partition.label_counts(labels, parts, 10)
    # Share of each class held by its largest client -> 1 as alpha -> 0 (min_size fix-up moves
    # at most one example per client).
    top_share = counts.max(axis=0) / counts.sum(axis=0)
    assert top_share.mean() > 0.95


def test_dirichlet_large_alpha_matches_global_distribution():
    labels = np.repeat(np.arange(5), 2000)
    parts = partition_schemes.dirichlet(labels, num_clients=5, alpha=1e4, seed=0)
    dist = _client_distributions(labels, parts, 5)
    # Dir(1e4 * 1_N) shares have sd ~ sqrt((1/5)(4/5)/5e4) = 0.0018 around 1/5.
    np.testing.assert_allclose(dist, 0.2, atol=0.02)
    sizes = np.array([len(v) for v in parts.values()])
    np.testing.assert_allclose(sizes, 2000, rtol=0.05)


def test_dirichlet_heterogeneity_decreases_with_alpha():
    labels = np.repeat(np.arange(10), 300)
    global_dist = np.full(10, 0.1)

    def mean_tv(alpha):
        dist = _client_distributions(labels, partition_schemes.dirichlet(labels, 20, alpha, seed=2), 10)
        return 0.5 * np.abs(dist - global_dist).sum(axis=1).mean()

    tvs = [mean_tv(a) for a in (0.01, 0.1, 1.0, 10.0, 1000.0)]
    assert all(a > b for a, b in zip(tvs, tvs[1:])), tvs


def test_dirichlet_min_size_respected():
    labels = np.repeat(np.arange(2), 50)
    parts = partition_schemes.dirichlet(labels, num_clients=30, alpha=0.01, seed=4, min_size=3)
    _assert_disjoint_cover(parts, 100)
    assert min(len(v) for v in parts.values()) >= 3


@pytest.mark.parametrize(
    "fn,kwargs",
    [
        (partition_schemes.iid, {}),
        (partition_schemes.shards, {"classes_per_client": 2}),
        (partition_schemes.dirichlet, {"alpha": 0.3}),
    ],
)
def test_same_seed_same_split_and_other_seed_differs(fn, kwargs):
    a = fn(LABELS, 12, seed=7, **kwargs)
    b = fn(LABELS, 12, seed=7, **kwargs)
    c = fn(LABELS, 12, seed=8, **kwargs)
    assert list(a) == list(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert any(not np.array_equal(a[k], c[k]) for k in a)


def test_more_clients_than_examples_fails_clearly():
    with pytest.raises(ValueError, match="cannot partition 5 examples among 6 clients"):
        partition_schemes.iid(np.arange(5), 6)
    with pytest.raises(ValueError, match="cannot partition 5 examples among 6 clients"):
        partition_schemes.dirichlet(np.zeros(5, int), 6, alpha=1.0)
    with pytest.raises(ValueError, match="cannot partition"):
        partition_schemes.partition(np.zeros(3, int), 4, "shards", classes_per_client=1)


def test_partition_dispatch_and_unknown_scheme():
    a = partition_schemes.partition(LABELS, 4, "dirichlet", seed=1, alpha=0.5)
    b = partition_schemes.dirichlet(LABELS, 4, 0.5, seed=1)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    with pytest.raises(ValueError, match="unknown partition scheme 'zipf'"):
        partition_schemes.partition(LABELS, 4, "zipf")


def test_by_group_one_client_per_group_and_split_groups():
    groups = np.array(["dvd"] * 5 + ["books"] * 7 + ["dvd"] * 3)
    parts = partition_schemes.by_group(groups)
    assert list(parts) == ["books", "dvd"]
    np.testing.assert_array_equal(parts["books"], np.arange(5, 12))
    np.testing.assert_array_equal(parts["dvd"], [0, 1, 2, 3, 4, 12, 13, 14])
    split = partition_schemes.by_group(groups, clients_per_group=2, seed=0)
    assert list(split) == ["books_0", "books_1", "dvd_0", "dvd_1"]
    _assert_disjoint_cover(split, 15)
    assert sorted(len(v) for v in split.values()) == [3, 4, 4, 4]
    assert set(groups[split["dvd_1"]]) == {"dvd"}
    with pytest.raises(ValueError, match="group 'books' has 7 examples"):
        partition_schemes.by_group(groups, clients_per_group=8)


def test_split_test_like_train_follows_client_label_distribution():
    train = np.repeat(np.arange(4), 100)
    # Client a: 60 of class 0, 40 of class 1. Client b: 40 of class 0, 100 of class 2.
    # Client c: 60 of class 1, 100 of class 3.
    parts = {
        "a": np.r_[0:60, 100:140],
        "b": np.r_[60:100, 200:300],
        "c": np.r_[140:200, 300:400],
    }
    test = np.repeat(np.arange(4), 50)
    out = partition.split_test_like_train(train, parts, test, seed=0)
    assert list(out) == ["a", "b", "c"]
    counts = partition.label_counts(test, out, 4)
    # Expected t_ic = 50 * n_ic / sum_j n_jc.
    np.testing.assert_array_equal(counts, [[30, 20, 0, 0], [20, 0, 50, 0], [0, 30, 0, 50]])
    all_idx = np.concatenate(list(out.values()))
    assert len(np.unique(all_idx)) == len(all_idx) == 200


def test_split_test_like_train_rounding_sums_to_class_total():
    train = np.repeat(np.arange(3), 30)
    parts = partition_schemes.iid(train, 7, seed=0)
    test = np.repeat(np.arange(3), 11)
    out = partition.split_test_like_train(train, parts, test, seed=0)
    counts = partition.label_counts(test, out, 3)
    np.testing.assert_array_equal(counts.sum(axis=0), [11, 11, 11])
    train_counts = partition.label_counts(train, parts, 3)
    np.testing.assert_array_less(np.abs(counts - 11 * train_counts / 30), 1.0)


def test_majority_label_accuracy_closed_form_on_label_like_test_shards():
    """The three clients above: a trains mostly on class 0 (60 of 100), b on 2 (100 of 140),
    c on 3 (100 of 160); their test shards hold 30 of class 0, 50 of class 2, 50 of class 3:
    130 of the 200 test examples."""
    train = np.repeat(np.arange(4), 100)
    parts = {"a": np.r_[0:60, 100:140], "b": np.r_[60:100, 200:300],
             "c": np.r_[140:200, 300:400]}
    test = np.repeat(np.arange(4), 50)
    shards = partition.split_test_like_train(train, parts, test, seed=0)
    assert partition.majority_label_accuracy(train, parts, test, shards) == 130 / 200


def test_majority_label_accuracy_matches_a_per_example_count():
    """Against an example-by-example count on a Dirichlet split with empty test shards."""
    import collections

    rng = np.random.default_rng(3)
    train = rng.integers(0, 3, 600)
    parts = partition_schemes.dirichlet(train, 12, alpha=0.3, seed=1)
    test = rng.integers(0, 3, 40)   # small: some clients get no test example
    shards = partition.split_test_like_train(train, parts, test, seed=2)
    assert any(len(v) == 0 for v in shards.values())
    correct = 0
    for cid, idx in parts.items():
        counts = collections.Counter(train[idx].tolist())
        best = max(counts.values())
        label = min(c for c, k in counts.items() if k == best)
        for j in shards[cid]:
            correct += test[j] == label
    assert partition.majority_label_accuracy(train, parts, test, shards) == pytest.approx(
        correct / 40)


def test_majority_label_accuracy_ties_and_errors():
    y = np.array([0, 1, 1, 0])
    train = {"a": np.array([0, 1])}   # one of each: the tie goes to label 0
    assert partition.majority_label_accuracy(y, train, y, {"a": np.array([2, 3])}) == 0.5
    with pytest.raises(ValueError, match="differ"):
        partition.majority_label_accuracy(y, train, y, {"b": np.array([2])})
    with pytest.raises(ValueError, match="every test shard is empty"):
        partition.majority_label_accuracy(y, train, y, {"a": np.array([], int)})


def test_check_partition_errors():
    with pytest.raises(ValueError, match="client 'x' has no examples"):
        partition.check_partition({"x": np.array([], int)}, 3)
    with pytest.raises(ValueError, match="shares examples"):
        partition.check_partition({"x": np.array([0]), "y": np.array([0, 1])}, 3)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
