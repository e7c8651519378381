"""The client partitioning schemes: labels (or group ids) of n examples -> a partition.

A partition is an ordered `dict[str, np.ndarray]` from client id to the int64 indices of that
client's examples: disjoint, every client non-empty, and the same seed always gives the same split.
The schemes (C classes, N clients): `iid` (a random permutation cut into N near-equal parts),
`shards` (k distinct classes per client, FedRep/SRPFL style), `dirichlet` (label skew with shares
p_c ~ Dir(α·1_N)), `by_group` (natural groups, e.g. domains), and `partition`, which picks a
label-based one by name. `tasks.partition` computes from a partition (label counts, per-client
test sets, checks).

Example:

>>> parts = iid(10, num_clients=2, seed=0)
>>> list(parts), sum(len(v) for v in parts.values())
(['client_000', 'client_001'], 10)
"""

import numpy as np

Partition = dict[str, np.ndarray]

SCHEMES = ("iid", "shards", "dirichlet")


def client_ids(num_clients: int) -> list[str]:
    """Zero-padded client ids `client_000`, `client_001`, ... (sort order = numeric order)."""
    width = max(3, len(str(num_clients - 1)))
    return [f"client_{i:0{width}d}" for i in range(num_clients)]


def _check_counts(num_examples: int, num_clients: int) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > num_examples:
        raise ValueError(
            f"cannot partition {num_examples} examples among {num_clients} clients: "
            "every client needs at least one example"
        )


def as_labels(labels) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be a 1-D array, got shape {labels.shape}")
    return labels


def iid(labels_or_size, num_clients: int, seed: int = 0) -> Partition:
    """Uniform random split into `num_clients` parts whose sizes differ by at most one.

    Args:
      labels_or_size: a 1-D label array (only its length is used) or the number of examples n.
      num_clients: N, with 1 <= N <= n.
      seed: seed of the permutation.

    Returns:
      Partition: client id -> sorted int64 indices; sizes are ⌊n/N⌋ or ⌈n/N⌉.

    Example:

    >>> [len(v) for v in iid(10, 3, seed=1).values()]
    [4, 3, 3]
    """
    n = int(labels_or_size) if np.isscalar(labels_or_size) else len(labels_or_size)
    _check_counts(n, num_clients)
    perm = np.random.default_rng(seed).permutation(n)
    parts = np.array_split(perm, num_clients)
    return {cid: np.sort(p).astype(np.int64) for cid, p in zip(client_ids(num_clients), parts)}


def shards(labels, num_clients: int, classes_per_client: int, seed: int = 0) -> Partition:
    """k classes per client (FedRep/SRPFL shards), every client holding exactly k distinct classes.

    Class slots: with a random class order π and a random client order σ, client σ(i) receives the
    classes π((i·k + j) mod C) for j = 0..k-1, so k <= C guarantees distinct classes and every class
    appears in ⌊Nk/C⌋ or ⌈Nk/C⌉ slots. Class c's shuffled examples are cut into as many equal shards
    as it has slots.

    Args:
      labels: 1-D integer labels of the n examples.
      num_clients: N.
      classes_per_client: k, 1 <= k <= C (C = number of distinct labels present).
      seed: seed of the class order, client order and within-class shuffles.

    Returns:
      Partition: client id -> sorted int64 indices.

    Raises:
      ValueError: k > C, or a class has fewer examples than the shards it must be cut into.

    Example:

    >>> labels = np.repeat(np.arange(4), 6)
    >>> parts = shards(labels, num_clients=4, classes_per_client=2, seed=0)
    >>> [len(v) for v in parts.values()]
    [6, 6, 6, 6]
    """
    labels = as_labels(labels)
    _check_counts(len(labels), num_clients)
    classes = np.unique(labels)
    num_classes = len(classes)
    k = int(classes_per_client)
    if not 1 <= k <= num_classes:
        raise ValueError(
            f"classes_per_client={classes_per_client} must be between 1 and the number of "
            f"classes present ({num_classes})"
        )
    rng = np.random.default_rng(seed)
    class_order = rng.permutation(classes)
    client_order = rng.permutation(num_clients)
    slots: dict = {c: [] for c in classes}  # class -> clients holding a shard of it
    for i, client in enumerate(client_order):
        for j in range(k):
            slots[class_order[(i * k + j) % num_classes]].append(int(client))
    members: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in classes:
        holders = slots[c]
        if not holders:
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        if len(idx) < len(holders):
            raise ValueError(
                f"class {c!r} has {len(idx)} examples but must be cut into {len(holders)} shards "
                f"({num_clients} clients x {k} classes per client over {num_classes} classes)"
            )
        for client, shard in zip(holders, np.array_split(idx, len(holders))):
            members[client].append(shard)
    return {
        cid: np.sort(np.concatenate(m)).astype(np.int64)
        for cid, m in zip(client_ids(num_clients), members)
    }


def dirichlet(
    labels, num_clients: int, alpha: float, seed: int = 0, min_size: int = 1
) -> Partition:
    """Dirichlet(α) label skew: each class is spread over clients with shares p_c ~ Dir(α·1_N).

    Class c's n_c shuffled examples are cut at round(n_c · cumsum(p_c)). Afterwards any client with
    fewer than `min_size` examples receives examples taken at random from the currently largest
    client, so every client is non-empty. Expected client label distribution: E[n_ic] = n_c / N;
    as α → 0 a class goes (almost) entirely to one client, as α → ∞ each client's label
    proportions approach the global ones.

    Args:
      labels: 1-D labels of the n examples.
      num_clients: N.
      alpha: concentration α > 0.
      seed: seed of the Dirichlet draws and shuffles.
      min_size: minimum examples per client, N·min_size <= n.

    Returns:
      Partition: client id -> sorted int64 indices.

    Example:

    >>> labels = np.repeat(np.arange(3), 50)
    >>> parts = dirichlet(labels, num_clients=4, alpha=0.5, seed=0)
    >>> sum(len(v) for v in parts.values())
    150
    """
    labels = as_labels(labels)
    _check_counts(len(labels), num_clients)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if num_clients * min_size > len(labels):
        raise ValueError(
            f"cannot give {num_clients} clients at least {min_size} examples each from "
            f"{len(labels)} examples"
        )
    rng = np.random.default_rng(seed)
    owner = np.empty(len(labels), dtype=np.int64)
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        shares = rng.dirichlet(np.full(num_clients, float(alpha)))
        shares = np.nan_to_num(shares, nan=0.0)  # guard against underflow at tiny α
        if shares.sum() <= 0:
            shares = np.eye(num_clients)[rng.integers(num_clients)]
        cuts = np.round(np.cumsum(shares / shares.sum()) * len(idx)).astype(np.int64)
        cuts[-1] = len(idx)
        start = 0
        for client, stop in enumerate(cuts):
            owner[idx[start:stop]] = client
            start = max(start, stop)
    sizes = np.bincount(owner, minlength=num_clients)
    for client in np.flatnonzero(sizes < min_size):
        while sizes[client] < min_size:
            donor = int(np.argmax(sizes))
            donor_idx = np.flatnonzero(owner == donor)
            take = min(min_size - sizes[client], sizes[donor] - min_size)
            moved = rng.choice(donor_idx, size=take, replace=False)
            owner[moved] = client
            sizes[client] += take
            sizes[donor] -= take
    return {
        cid: np.flatnonzero(owner == i).astype(np.int64)
        for i, cid in enumerate(client_ids(num_clients))
    }


def by_group(groups, clients_per_group: int = 1, seed: int = 0) -> Partition:
    """Natural non-IID clients: one group (e.g. review domain) per client or per client group.

    Groups are taken in sorted order. With `clients_per_group == 1` the client id is the group
    name; otherwise group g is split IID into clients `f"{g}_{j}"`, j = 0..clients_per_group-1.

    Args:
      groups: 1-D array of group ids (strings or ints), one per example.
      clients_per_group: clients each group is split into.
      seed: seed of the within-group IID splits (group g uses seed + its sorted position).

    Returns:
      Partition: client id -> sorted int64 indices.

    Example:

    >>> list(by_group(np.array(["b", "a", "b", "a"]), clients_per_group=1))
    ['a', 'b']
    """
    groups = as_labels(groups)
    if len(groups) == 0:
        raise ValueError("by_group needs at least one example")
    out: Partition = {}
    for g_pos, g in enumerate(np.unique(groups)):
        idx = np.flatnonzero(groups == g)
        if clients_per_group == 1:
            out[str(g)] = idx.astype(np.int64)
            continue
        if clients_per_group > len(idx):
            raise ValueError(
                f"group {g!r} has {len(idx)} examples, fewer than clients_per_group="
                f"{clients_per_group}"
            )
        sub = iid(len(idx), clients_per_group, seed=seed + g_pos)
        for j, local in enumerate(sub.values()):
            out[f"{g}_{j}"] = idx[local]
    return out


def partition(labels, num_clients: int, scheme: str = "iid", seed: int = 0, **kwargs) -> Partition:
    """Dispatch to a label-based scheme by name: "iid", "shards" or "dirichlet".

    `kwargs` are forwarded: `classes_per_client` for "shards", `alpha` (and `min_size`) for
    "dirichlet".

    Example:

    >>> labels = np.repeat(np.arange(4), 5)
    >>> len(partition(labels, 4, "shards", classes_per_client=1))
    4
    """
    if scheme == "iid":
        return iid(labels, num_clients, seed=seed, **kwargs)
    if scheme == "shards":
        return shards(labels, num_clients, seed=seed, **kwargs)
    if scheme == "dirichlet":
        return dirichlet(labels, num_clients, seed=seed, **kwargs)
    raise ValueError(f"unknown partition scheme {scheme!r}; expected one of {SCHEMES}")
