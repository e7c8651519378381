"""Tokenize text once, inside `tf.data`, into BERT-style int32 inputs of fixed length.

The output of `tokenize` is the input dict of KerasNLP's `BertBackbone`:

    {"token_ids":    int32 (n, L),   [CLS] a [SEP] (b [SEP]) then pad ids,
     "segment_ids":  int32 (n, L),   0 on segment a (and its [CLS]/[SEP]), 1 on segment b, 0 on pad,
     "padding_mask": int32 (n, L)}   1 on real tokens, 0 on padding.

Segments are truncated round-robin so that everything fits in L = `sequence_length`. A packer
built with `trim=True` then cuts each batch to its longest example, and `tokenize` pads the batches
to the longest example of all: L is then the longest tokenized text (at most `sequence_length`),
so no text is cut that fits the model. The texts are
mapped through the preprocessor in large batches by `tf.data` (parallel map) exactly once; the
result is a dict of numpy arrays that partitions and `ArrayClientData` then slice without
re-tokenizing (the cache).

Two ways to get a preprocessor:

* `BertInputPacker(tokenizer, sequence_length)`: any KerasNLP tokenizer with `token_to_id` (e.g.
  `keras_nlp.models.BertTokenizer` or `keras_nlp.tokenizers.WordPieceTokenizer`) plus a
  `keras_nlp.layers.MultiSegmentPacker`;
* `bert_packer(vocabulary, sequence_length, lowercase)`: the same from a vocabulary list or a
  `vocab.txt` path (e.g. all-MiniLM-L6-v2's).

A `keras_nlp.models.BertPreprocessor` (or any callable mapping a tuple of string tensors to such a
dict) works as well.

Example:

>>> vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "movie"]
>>> packer = bert_packer(vocab, sequence_length=6)
>>> out = tokenize((np.array(["good movie", "bad"], dtype=object),), packer)
>>> out["token_ids"].tolist()
[[2, 5, 7, 3, 0, 0], [2, 6, 3, 0, 0, 0]]
"""

import collections
import os
from collections.abc import Callable, Sequence

import keras_nlp
import numpy as np
import tensorflow as tf

BERT_INPUTS = ("token_ids", "segment_ids", "padding_mask")


class BertInputPacker:
    """tokenizer + `MultiSegmentPacker`: tuple of string tensors (batch,) -> BERT input dict.

    Args:
      tokenizer: a KerasNLP tokenizer with `token_to_id`; its output is a ragged (batch, None)
        tensor of ids.
      sequence_length: L.
      cls_token, sep_token, pad_token: the special tokens (looked up in the tokenizer).
      trim: cut each packed batch to its longest example (`tokenize` then pads to the longest of
        all), so that L is a cap, not a width.

    Example:

    >>> tok = keras_nlp.models.BertTokenizer(
    ...     vocabulary=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hi"])
    >>> BertInputPacker(tok, 4)((tf.constant(["hi"]),))["padding_mask"].numpy().tolist()
    [[1, 1, 1, 0]]
    >>> BertInputPacker(tok, 8, trim=True)((tf.constant(["hi", "hi hi"]),))["token_ids"].shape
    TensorShape([2, 4])
    """

    def __init__(
        self,
        tokenizer,
        sequence_length: int,
        cls_token: str = "[CLS]",
        sep_token: str = "[SEP]",
        pad_token: str = "[PAD]",
        trim: bool = False,
    ):
        if sequence_length < 3:
            raise ValueError(f"sequence_length must be >= 3, got {sequence_length}")
        self.tokenizer = tokenizer
        self.sequence_length = int(sequence_length)
        self.pad_id = int(tokenizer.token_to_id(pad_token))
        self.trim = bool(trim)
        self.packer = keras_nlp.layers.MultiSegmentPacker(
            sequence_length=self.sequence_length,
            start_value=int(tokenizer.token_to_id(cls_token)),
            end_value=int(tokenizer.token_to_id(sep_token)),
            pad_value=self.pad_id,
            truncate="round_robin",
        )

    def __call__(self, segments) -> dict[str, tf.Tensor]:
        if not isinstance(segments, (tuple, list)):
            segments = (segments,)
        token_ids, segment_ids = self.packer(tuple(self.tokenizer(s) for s in segments))
        # tf.not_equal, not `!=`: run as `python scripts/benchmark_text.py`, `!=` inside this
        # tf.data map gave one Python bool (tensors compared as objects), a scalar mask.
        padding_mask = tf.cast(tf.not_equal(token_ids, self.pad_id), tf.int32)
        if self.trim:
            longest = tf.reduce_max(tf.reduce_sum(padding_mask, axis=1))
            token_ids, segment_ids, padding_mask = (
                t[:, :longest] for t in (token_ids, segment_ids, padding_mask))
        return {
            "token_ids": tf.cast(token_ids, tf.int32),
            "segment_ids": tf.cast(segment_ids, tf.int32),
            "padding_mask": padding_mask,
        }


def bert_packer(
    vocabulary: Sequence[str] | str | os.PathLike, sequence_length: int, lowercase: bool = True,
    trim: bool = False,
) -> BertInputPacker:
    """`BertInputPacker` over `keras_nlp.models.BertTokenizer(vocabulary, lowercase)`.

    Args:
      vocabulary: list of WordPiece tokens or a path to a `vocab.txt` (one token per line); must
        contain [PAD], [CLS], [SEP], [MASK].
      sequence_length: L.
      lowercase: lower-case before tokenizing (True for uncased models such as all-MiniLM-L6-v2).
      trim: as `BertInputPacker`'s.

    Example:

    >>> packer = bert_packer("model/vocab.txt", 128)  # doctest: +SKIP
    """
    if isinstance(vocabulary, (str, os.PathLike)):
        if not os.path.isfile(vocabulary):
            raise FileNotFoundError(f"vocabulary file not found: {vocabulary}")
        vocabulary = os.fspath(vocabulary)
    else:
        vocabulary = list(vocabulary)
    tokenizer = keras_nlp.models.BertTokenizer(vocabulary=vocabulary, lowercase=lowercase)
    return BertInputPacker(tokenizer, sequence_length, trim=trim)


def tokenize(
    segments: Sequence[np.ndarray],
    preprocessor: Callable[[tuple], dict],
    batch_size: int = 1024,
) -> dict[str, np.ndarray]:
    """Run `preprocessor` over all texts once in a batched, parallel `tf.data` map.

    Args:
      segments: one or two arrays of n strings (e.g. `TextExamples.segments`).
      preprocessor: tuple of string tensors (b,) -> dict of (b, L) tensors.
      batch_size: texts per preprocessor call.

    Returns:
      `OrderedDict` name -> int32 array (n, L), its keys (the preprocessor's) sorted, the form
      TFF serializes a dataset's named elements in; batches of
      different widths (a trimming packer's) are padded to the widest, with the preprocessor's
      `pad_id` (default 0) for `token_ids` and 0 elsewhere.

    Example:

    >>> out = tokenize((np.array(["hi"] * 3, dtype=object),), packer)  # doctest: +SKIP
    >>> out["token_ids"].shape  # doctest: +SKIP
    (3, 128)
    """
    segments = tuple(np.asarray(s, dtype=object).astype(str) for s in segments)
    if not segments or len({len(s) for s in segments}) != 1:
        raise ValueError("tokenize needs one or more segment arrays of equal length")
    # Traced as written, without AutoGraph: KerasNLP's preprocessing is graph code already, and
    # AutoGraph's rewrite of its layers took about 4 s of a run's start (3.6 s of 5.2 s on 674
    # SST-2 sentences), for the same tokens.
    dataset = (
        tf.data.Dataset.from_tensor_slices(segments)
        .batch(batch_size)
        .map(tf.autograph.experimental.do_not_convert(lambda *segs: preprocessor(tuple(segs))),
             num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )
    chunks: dict[str, list[np.ndarray]] = {}
    for batch in dataset.as_numpy_iterator():
        for key, value in batch.items():
            chunks.setdefault(key, []).append(np.asarray(value).astype(np.int32))
    if not chunks:
        raise ValueError("tokenize got no texts")
    pad_id = getattr(preprocessor, "pad_id", 0)
    return collections.OrderedDict(
        (key, _concatenate_padded(chunks[key], pad_id if key == "token_ids" else 0))
        for key in sorted(chunks))


def _concatenate_padded(chunks: list[np.ndarray], pad_value: int) -> np.ndarray:
    """The (b_k, L_k) chunks stacked into (Σ b_k, max L_k), each padded on the right."""
    width = max(c.shape[1] for c in chunks)
    return np.concatenate([
        np.pad(c, ((0, 0), (0, width - c.shape[1])), constant_values=pad_value) for c in chunks])
