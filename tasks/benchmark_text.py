"""Time loading, tokenizing and partitioning the whole SST-2 train set into federated clients.

`measure()` returns seconds per stage; without a vocabulary file, a word-level WordPiece
vocabulary of the `vocab_size` most frequent lower-cased training words is built first (its time
is its own stage). `scripts/benchmark_text.py` is the command line.

Example:

>>> figures = measure("../shared/data/sst2", vocab="vocab.txt", num_clients=50)  # doctest: +SKIP
>>> sorted(figures)  # doctest: +SKIP
['build_vocab', 'client_data', 'first_batches', 'load_tsv', 'partition', 'tokenize', 'total']
"""

import collections
import os
import time

from tasks import client_data as client_data_lib
from tasks import partition_schemes, text_files
from tasks import text as text_lib

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def frequency_vocabulary(texts, vocab_size: int) -> list[str]:
    """Special tokens then the `vocab_size` most frequent lower-cased whitespace words (ties: a-z).

    Example:

    >>> frequency_vocabulary(["b a a", "c a b"], 2)[5:]
    ['a', 'b']
    """
    counts = collections.Counter(w for t in texts for w in str(t).lower().split())
    words = sorted(counts, key=lambda w: (-counts[w], w))[:vocab_size]
    return list(SPECIAL_TOKENS) + [w for w in words if w not in SPECIAL_TOKENS]


def measure(
    data_dir: str | os.PathLike,
    vocab: str | os.PathLike | None = None,
    num_clients: int = 50,
    sequence_length: int = 64,
    scheme: str = "dirichlet",
    alpha: float = 0.5,
    vocab_size: int = 20000,
    seed: int = 0,
) -> dict[str, float]:
    """Seconds per stage: load_tsv, build_vocab, tokenize, partition, client_data, first_batches."""
    times: dict[str, float] = {}
    start = last = time.perf_counter()

    def lap(name):
        nonlocal last
        now = time.perf_counter()
        times[name] = now - last
        last = now

    train = text_files.load_glue_tsv(data_dir, "sst2", splits=("train",))["train"]
    lap("load_tsv")
    vocabulary = vocab if vocab is not None else frequency_vocabulary(train.segments[0], vocab_size)
    packer = text_lib.bert_packer(vocabulary, sequence_length, lowercase=True)
    lap("build_vocab")
    features = text_lib.tokenize(train.segments, packer)
    lap("tokenize")
    kwargs = {"alpha": alpha} if scheme == "dirichlet" else {}
    parts = partition_schemes.partition(train.labels, num_clients, scheme, seed, **kwargs)
    lap("partition")
    data = client_data_lib.ArrayClientData(features, train.labels, parts)
    lap("client_data")
    fn = client_data_lib.preprocess_fn(batch_size=32, shuffle_buffer=1000, seed=seed)
    for cid in data.client_ids:
        next(iter(fn(data.create_tf_dataset_for_client(cid))))
    lap("first_batches")
    times["total"] = last - start
    times["num_examples"] = float(len(train))
    return times


def format_figures(figures: dict[str, float], num_clients: int, scheme: str,
                   sequence_length: int, vocab: str | None) -> str:
    """`measure`'s figures as the lines `scripts/benchmark_text.py` prints.

    >>> print(format_figures({"tokenize": 2.0, "total": 3.0, "num_examples": 100.0}, 4, "iid", 8,
    ...                      None))
    SST-2 train: 100 examples -> 4 clients (iid), sequence_length=8, vocab=frequency
            tokenize:    2.00 s
               total:    3.00 s
      tokenize rate : 50 examples/s
    """
    figures = dict(figures)
    n = int(figures.pop("num_examples"))
    lines = [f"SST-2 train: {n} examples -> {num_clients} clients ({scheme}), "
             f"sequence_length={sequence_length}, vocab={vocab or 'frequency'}"]
    lines += [f"  {name:>14s}: {seconds:7.2f} s" for name, seconds in figures.items()]
    lines.append(f"  tokenize rate : {n / max(figures['tokenize'], 1e-9):,.0f} examples/s")
    return "\n".join(lines)
