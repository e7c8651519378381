"""Evaluating a decoder language model on many prompts at once: greedy generation and
likelihood scoring in batches.

`models.causal_lm.greedy_generate` and `continuation_log_likelihood` take one prompt at a time;
an evaluation over a dev set runs the same computations on batches of right-padded rows:

- `generate(backbone, prompts, max_new_tokens, stop_ids)`: each step runs the backbone once on
  the whole (B, T) buffer and appends to every unfinished row the argmax of its next-token
  logits, h[b, len_b − 1] · Eᵀ. Right padding leaves a row's positions 0..len_b − 1 as they are
  alone (causal attention, absolute positions from 0), so every row's continuation equals
  `greedy_generate` on it alone.
- `log_likelihoods(backbone, prompts, continuations)`: log p(c_i | p_i) = Σ_j log softmax(
  h_{j−1} · Eᵀ)[c_{i,j}] for every pair, the rows packed as prompt + continuation + padding,
  with the projection onto the vocabulary at the continuation's positions only
  (`causal_lm.response_logits`), summed per row.
- `choose(backbone, prompts, candidates)`: per prompt, the index of the most likely candidate
  (every prompt scored against every candidate: B · C rows).

Example (a tiny random GPT-2):

>>> import keras_nlp
>>> backbone = keras_nlp.models.GPT2Backbone(vocabulary_size=20, num_layers=1, num_heads=1,
...     hidden_dim=4, intermediate_dim=8, max_sequence_length=16)
>>> from models import causal_lm
>>> prompts = [[1, 2, 3], [4, 5]]
>>> generate(backbone, prompts, 3) == [causal_lm.greedy_generate(backbone, p, 3)
...                                     for p in prompts]
True
>>> choose(backbone, prompts, [[6], [7, 8]]).shape
(2,)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from models import causal_lm


def _right_padded(rows: Sequence[Sequence[int]], width: int, pad_id: int) -> np.ndarray:
    out = np.full((len(rows), width), pad_id, np.int32)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def _check_prompts(prompts: Sequence[Sequence[int]]) -> None:
    empty = [i for i, p in enumerate(prompts) if not len(p)]
    if empty:
        raise ValueError(f"prompt {empty[0]} has no tokens; every prompt needs at least one")


def _next_token_fn(backbone: tf.keras.Model):
    """`(token_ids (B, T), lengths (B,)) -> argmax token at position lengths_b` as a graph."""

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32),
                                  tf.TensorSpec([None], tf.int32)])
    def next_tokens(token_ids, lengths):
        mask = tf.sequence_mask(lengths, tf.shape(token_ids)[1], dtype=tf.int32)
        hidden = backbone({"token_ids": token_ids, "padding_mask": mask}, training=False)
        last = tf.gather(hidden, lengths - 1, axis=1, batch_dims=1)
        logits = causal_lm.output_logits(backbone.token_embedding, last)
        return tf.argmax(logits, axis=-1, output_type=tf.int32)

    return next_tokens


def generate(backbone: tf.keras.Model, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             stop_ids: Sequence[int] = (), pad_id: int = 0, batch_size: int = 32
             ) -> list[list[int]]:
    """The greedy continuation of every prompt (at most `max_new_tokens` tokens each, ending
    before the first token of `stop_ids`, which is not returned), `batch_size` prompts a call."""
    _check_prompts(prompts)
    next_tokens = _next_token_fn(backbone)
    stops = set(int(s) for s in stop_ids)
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        rows = [list(p) for p in prompts[start:start + batch_size]]
        lengths = np.array([len(r) for r in rows], np.int32)
        token_ids = _right_padded(rows, int(lengths.max()) + max_new_tokens, pad_id)
        generated: list[list[int]] = [[] for _ in rows]
        active = np.ones(len(rows), bool)
        for _ in range(max_new_tokens):
            tokens = next_tokens(token_ids, lengths).numpy()
            for b in np.flatnonzero(active):
                if int(tokens[b]) in stops:
                    active[b] = False
                    continue
                token_ids[b, lengths[b]] = tokens[b]
                generated[b].append(int(tokens[b]))
                lengths[b] += 1
            if not active.any():
                break
        out.extend(generated)
    return out


def _row_log_likelihood_fn(backbone: tf.keras.Model):
    """`batch -> (B,)` Σ over each row's response tokens of log p(token | before), as a graph."""
    spec = tf.TensorSpec([None, None], tf.int32)

    @tf.function(input_signature=[{"token_ids": spec, "padding_mask": spec,
                                   "response_mask": spec}])
    def row_log_likelihoods(batch):
        logits, targets = causal_lm.response_logits(backbone, batch)
        picked = tf.gather(tf.nn.log_softmax(logits), targets, axis=1, batch_dims=1)
        row_of = causal_lm.response_indices(batch["response_mask"])[:, 0]
        return tf.math.unsorted_segment_sum(picked, row_of, tf.shape(batch["token_ids"])[0])

    return row_log_likelihoods


def log_likelihoods(backbone: tf.keras.Model, prompts: Sequence[Sequence[int]],
                    continuations: Sequence[Sequence[int]], pad_id: int = 0,
                    batch_size: int = 32) -> np.ndarray:
    """(n,) float64: log p(continuations[i] | prompts[i]), natural log."""
    if len(prompts) != len(continuations):
        raise ValueError(f"{len(prompts)} prompts for {len(continuations)} continuations")
    _check_prompts(prompts)
    if any(not len(c) for c in continuations):
        raise ValueError("every continuation needs at least one token")
    row_log_likelihoods = _row_log_likelihood_fn(backbone)
    scores = []
    for start in range(0, len(prompts), batch_size):
        rows = [list(p) + list(c) for p, c in zip(prompts[start:start + batch_size],
                                                  continuations[start:start + batch_size])]
        width = max(len(r) for r in rows)
        token_ids = _right_padded(rows, width, pad_id)
        padding = _right_padded([[1] * len(r) for r in rows], width, 0)
        response = np.zeros_like(token_ids)
        for i, p in enumerate(prompts[start:start + batch_size]):
            response[i, len(p):len(rows[i])] = 1
        batch = {"token_ids": token_ids, "padding_mask": padding, "response_mask": response}
        scores.append(row_log_likelihoods(batch).numpy())
    return np.concatenate(scores).astype(np.float64)


def choose(backbone: tf.keras.Model, prompts: Sequence[Sequence[int]],
           candidates: Sequence[Sequence[int]], pad_id: int = 0, batch_size: int = 32
           ) -> np.ndarray:
    """(n,) int: for each prompt, the index of its most likely continuation among `candidates`
    (shared by every prompt)."""
    pairs = [(p, c) for p in prompts for c in candidates]
    scores = log_likelihoods(backbone, [p for p, _ in pairs], [c for _, c in pairs], pad_id,
                             batch_size)
    return np.argmax(scores.reshape(len(prompts), len(candidates)), axis=1)
