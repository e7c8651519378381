"""Client partitioning of labelled numpy data: IID, k classes per client, Dirichlet, natural groups.

The schemes themselves are in `tasks.partition_schemes`; this module adds
what is computed from a partition: label counts, per-client test sets, the majority-label
baseline and the partition check.

Every scheme maps the labels (or group ids) of `n` examples to a *partition*: an ordered
`dict[str, np.ndarray]` from client id to the int64 indices of that client's examples. A partition
is disjoint, every client is non-empty, and the same seed always gives the same split. Loaders share
these functions and then gather their own features with the indices (see
`tasks.client_data.ArrayClientData`).

Schemes (C classes, N clients):

* `iid`: a random permutation cut into N near-equal parts (sizes differ by at most 1).
* `shards` (FedRep/SRPFL style): client i gets exactly `k` distinct classes. Over the N·k
  (client, class) slots every class is used ⌊Nk/C⌋ or ⌈Nk/C⌉ times; each class's examples are
  shuffled and cut into equal shards, one per slot holding that class.
* `dirichlet`: for every class c, shares p_c ~ Dir(α·1_N) over clients, and class c's examples are
  cut at the cumulative shares. α → 0 gives each class to one client; α → ∞ gives every client the
  global label distribution. Clients left with fewer than `min_size` examples get examples moved
  from the largest client (the fix-up keeps the split deterministic).
* `by_group`: natural non-IID clients, one domain (group) per client, or each group split IID into
  `clients_per_group` clients.

Personalized evaluation: `split_test_like_train` cuts a test set so that each client's test labels
follow its own training label distribution (class c's test examples are shared among clients in
proportion to their training counts of c, with largest-remainder rounding).

Example:

>>> from tasks.partition_schemes import shards
>>> labels = np.repeat(np.arange(10), 20)
>>> parts = shards(labels, num_clients=5, classes_per_client=2, seed=0)
>>> sorted(len(np.unique(labels[idx])) for idx in parts.values())
[2, 2, 2, 2, 2]
"""

from collections.abc import Mapping, Sequence

import numpy as np

from tasks.partition_schemes import Partition, as_labels


def label_counts(labels, parts: Mapping[str, np.ndarray], num_classes: int) -> np.ndarray:
    """Array (N, C): entry (i, c) = number of examples of class c at client i."""
    labels = as_labels(labels)
    return np.stack(
        [np.bincount(labels[idx], minlength=num_classes)[:num_classes] for idx in parts.values()]
    )


def _largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
    """Integers proportional to `weights` summing to `total` (largest-remainder rounding)."""
    exact = total * weights / weights.sum()
    base = np.floor(exact).astype(np.int64)
    rest = total - base.sum()
    order = np.argsort(-(exact - base), kind="stable")
    base[order[:rest]] += 1
    return base


def split_test_like_train(
    train_labels, train_parts: Mapping[str, np.ndarray], test_labels, seed: int = 0
) -> Partition:
    """Disjoint per-client test sets whose labels follow each client's training distribution.

    For every class c with test examples T_c and training counts n_ic: client i receives
    t_ic ≈ T_c · n_ic / Σ_j n_jc test examples of class c (largest-remainder rounding, so
    Σ_i t_ic = T_c when some client trains on c). When test and train class marginals agree, the
    test label proportions of client i equal its training ones up to rounding. Test examples of a
    class no client trains on are left out (they remain in the global test set). A client may get
    an empty test set when the test set is small.

    Args:
      train_labels: 1-D training labels.
      train_parts: the training partition.
      test_labels: 1-D test labels.
      seed: seed of the within-class shuffles.

    Returns:
      Partition with the same client ids (and order) as `train_parts`.

    Example:

    >>> y = np.repeat(np.arange(2), 10)
    >>> parts = {"a": np.arange(10), "b": np.arange(10, 20)}
    >>> {k: np.unique(y[v]).tolist() for k, v in split_test_like_train(y, parts, y).items()}
    {'a': [0], 'b': [1]}
    """
    train_labels = as_labels(train_labels)
    test_labels = as_labels(test_labels)
    ids = list(train_parts)
    rng = np.random.default_rng(seed)
    members: list[list[np.ndarray]] = [[] for _ in ids]
    for c in np.unique(test_labels):
        counts = np.array([np.sum(train_labels[train_parts[cid]] == c) for cid in ids], float)
        if counts.sum() == 0:
            continue
        idx = rng.permutation(np.flatnonzero(test_labels == c))
        take = _largest_remainder(len(idx), counts)
        for i, stop in enumerate(np.cumsum(take)):
            members[i].append(idx[stop - take[i] : stop])
    return {
        cid: np.sort(np.concatenate(m)).astype(np.int64) if m else np.zeros(0, np.int64)
        for cid, m in zip(ids, members)
    }


def majority_label_accuracy(
    train_labels, train_parts: Mapping[str, np.ndarray], test_labels,
    test_parts: Mapping[str, np.ndarray],
) -> float:
    """Pooled accuracy of the model-free personal predictor: client i answers every example of
    its test shard with its most common training label (the smaller label on a tie).

    With n_ic the training count of class c at client i and t_ic its test count, the accuracy is
    Σ_i t_{i,argmax_c n_ic} / Σ_i Σ_c t_ic. Under label skew (`split_test_like_train` shards)
    it is what a personalized model scores from its client's label mix alone, the reference
    its pooled personalized accuracy is read against. Clients with an empty test shard count
    for nothing.

    Example:

    >>> y = np.array([0, 0, 1, 1, 1, 0])
    >>> train = {"a": np.array([0, 1, 2]), "b": np.array([3, 4, 5])}   # a: 0,0,1; b: 1,1,0
    >>> test = {"a": np.array([0, 2, 5]), "b": np.array([1, 3, 4])}    # a: 0,1,0; b: 0,1,1
    >>> majority_label_accuracy(y, train, y, test)   # a scores 2 of 3, b 2 of 3
    0.6666666666666666
    """
    train_labels = as_labels(train_labels)
    test_labels = as_labels(test_labels)
    if list(train_parts) != list(test_parts):
        raise ValueError(f"train clients {list(train_parts)} and test clients "
                         f"{list(test_parts)} differ")
    total = sum(len(idx) for idx in test_parts.values())
    if total == 0:
        raise ValueError("every test shard is empty: there is nothing to score")
    correct = 0
    for cid, idx in train_parts.items():
        if len(idx) == 0:
            raise ValueError(f"client {cid!r} has no training examples to take a label from")
        majority = np.argmax(np.bincount(train_labels[idx]))
        correct += int(np.sum(test_labels[test_parts[cid]] == majority))
    return correct / total


def check_partition(parts: Mapping[str, np.ndarray], num_examples: int) -> None:
    """Raise ValueError unless parts are non-empty, disjoint and index into [0, num_examples)."""
    seen = np.zeros(num_examples, dtype=bool)
    for cid, idx in parts.items():
        if len(idx) == 0:
            raise ValueError(f"client {cid!r} has no examples")
        if idx.min() < 0 or idx.max() >= num_examples:
            raise ValueError(f"client {cid!r} has indices outside [0, {num_examples})")
        if seen[idx].any():
            raise ValueError(f"client {cid!r} shares examples with another client")
        seen[idx] = True


__all__: Sequence[str] = (
    "check_partition",
    "label_counts",
    "majority_label_accuracy",
    "split_test_like_train",
)
