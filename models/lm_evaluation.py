"""Evaluating a decoder language model on many prompts at once: greedy generation and
likelihood scoring in batches.

`models.causal_lm.greedy_generate` and `continuation_log_likelihood` take one prompt at a time;
an evaluation over a dev set runs the same computations on batches of right-padded rows:

- `generate(backbone, prompts, max_new_tokens, stop_ids)`: appends to every unfinished row the
  argmax of its next-token logits, h[b, len_b − 1] · Eᵀ, `max_new_tokens` times at most. Every
  row's continuation equals `greedy_generate` on it alone (the same logits, up to float32
  rounding): each row attends only to its own positions 0..len_b − 1, causally, with its own
  absolute positions from 0.
- `log_likelihoods(backbone, prompts, continuations)`: log p(c_i | p_i) = Σ_j log softmax(
  h_{j−1} · Eᵀ)[c_{i,j}] for every pair, the rows packed as prompt + continuation + padding,
  with the projection onto the vocabulary at the continuation's positions only
  (`causal_lm.response_logits`), summed per row.
- `choose(backbone, prompts, candidates)`: per prompt, the index of the most likely candidate
  (every prompt scored against every candidate: B · C rows).

Generation with a key/value cache (`has_cache`: KerasNLP's `GPT2Backbone` and
`models.gemma3_backbone.Gemma3Backbone`). A batch of B prompts, the longest P tokens, after
which n tokens will be fed (n = max_new_tokens − 1: the last token is never fed), gets a cache
of S = P + n slots per decoder layer, (B, 2, S, heads, head width):

    slot j < P:     prompt token j of row b, at position j (empty when j ≥ len_b)
    slot P + s:     the token fed at step s, at position len_b + s of row b

One prompt pass (a graph) runs the backbone on the (B, P) prompts, fills slots 0..P − 1 and
gives each row's first token; each step (another graph) feeds one token per row, writes its
keys and values into slot P + s (the same slot in every row, whatever the rows' lengths) and
attends over the cache. Which slots a query at position t reads is decided by position alone
(`cache_key_positions`: the position each slot holds, an empty slot's later than every query's):
those with key position ≤ t, and for Gemma 3's local layers t − key position < W. RoPE rotates
every key at its own position before it is cached, and GPT-2 adds the position embedding of
len_b + s, so a step computes what the whole buffer computes at position len_b + s (up to float
rounding), at the cost of one position: n + 1 tokens cost P + n positions per row instead of
(n + 1)·(P + n + 1). The projections are the backbone's own layers (LoRA wrappers included), so
an adapted model generates with its adapters. Another backbone falls back to running the whole
(B, P + n + 1) buffer at every step (e.g. KerasNLP 0.8's Llama, whose cached attention rotates
the new token's query as if it sat at position 0).
`cached_next_token_logits` exposes the cache's logits (teacher-forced) for checking.

Example (a tiny random GPT-2):

>>> import keras_nlp
>>> backbone = keras_nlp.models.GPT2Backbone(vocabulary_size=20, num_layers=1, num_heads=1,
...     hidden_dim=4, intermediate_dim=8, max_sequence_length=16)
>>> from models import causal_lm
>>> prompts = [[1, 2, 3], [4, 5]]
>>> has_cache(backbone)
True
>>> generate(backbone, prompts, 3) == [causal_lm.greedy_generate(backbone, p, 3)
...                                     for p in prompts]
True
>>> choose(backbone, prompts, [[6], [7, 8]]).shape
(2,)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras_nlp
import numpy as np
import tensorflow as tf

from models import causal_lm
from models.gemma3_backbone import Gemma3Backbone

# The key position of a cache slot that holds no token: later than every query's.
EMPTY_SLOT = 2 ** 30


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
    """`(token_ids (B, T), lengths (B,)) -> argmax token at position lengths_b` as a graph: the
    uncached step, the whole buffer through the backbone."""

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32),
                                  tf.TensorSpec([None], tf.int32)])
    def next_tokens(token_ids, lengths):
        mask = tf.sequence_mask(lengths, tf.shape(token_ids)[1], dtype=tf.int32)
        hidden = backbone({"token_ids": token_ids, "padding_mask": mask}, training=False)
        last = tf.gather(hidden, lengths - 1, axis=1, batch_dims=1)
        logits = causal_lm.output_logits(backbone.token_embedding, last)
        return tf.argmax(logits, axis=-1, output_type=tf.int32)

    return next_tokens


def cache_key_positions(lengths: tf.Tensor, prompt_width: tf.Tensor, steps: tf.Tensor
                        ) -> tf.Tensor:
    """(B, P + n) int32: the position of the token in each cache slot (module doc), for prompts
    of `lengths` (B,) right-padded to P = `prompt_width`, then n = `steps` fed tokens:

        slot j < P:   j if j < len_b, else EMPTY_SLOT (padding: read by no query)
        slot P + s:   len_b + s (the token fed at step s)

    >>> cache_key_positions([3, 1], 3, 2).numpy().tolist()
    [[0, 1, 2, 3, 4], [0, 1073741824, 1073741824, 1, 2]]
    """
    lengths = tf.convert_to_tensor(lengths, tf.int32)[:, None]
    slots = tf.range(prompt_width + steps)[None, :]
    prompt = tf.where(slots < lengths, slots, EMPTY_SLOT)
    return tf.where(slots < prompt_width, prompt, lengths + slots - prompt_width)


def _gpt2_call_with_cache(backbone: tf.keras.Model, token_ids: tf.Tensor, cache: tuple,
                          cache_update_index, positions: tf.Tensor, key_positions: tf.Tensor
                          ) -> tuple[tf.Tensor, tuple]:
    """`Gemma3Backbone.call_with_cache` for KerasNLP's GPT-2: token embedding + the position
    embedding of each row's own `positions` (B, T), then every `TransformerDecoder` with its
    `self_attention_cache` (B, 2, S, heads, D) written at `cache_update_index` and the mask
    key_positions ≤ positions as its `decoder_attention_mask` (B, T, S). KerasNLP intersects it
    with its own causal mask, slot ≤ i + t, which every slot this mask allows to a token (not a
    padding query) satisfies."""
    tokens = backbone.token_embedding(token_ids)
    table = tf.convert_to_tensor(backbone.position_embedding.position_embeddings)
    x = backbone.embeddings_add((tokens, tf.cast(tf.gather(table, positions), tokens.dtype)))
    x = backbone.embeddings_dropout(x, training=False)
    mask = tf.cast(key_positions[:, None, :] <= positions[:, :, None], tf.int32)
    updated = []
    for layer, layer_cache in zip(backbone.transformer_layers, cache):
        x, layer_cache = layer(x, decoder_attention_mask=mask, self_attention_cache=layer_cache,
                               self_attention_cache_update_index=cache_update_index)
        updated.append(layer_cache)
    return backbone.layer_norm(x), tuple(updated)


def _cache_layout(backbone: tf.keras.Model) -> tuple[Callable, int, int] | None:
    """`(call_with_cache, heads, head width)` of the backbone's cache, None without one."""
    if isinstance(backbone, Gemma3Backbone):
        config = backbone.config
        return backbone.call_with_cache, config.num_key_value_heads, config.head_dim
    if isinstance(backbone, keras_nlp.models.GPT2Backbone):
        def call_with_cache(*args):
            return _gpt2_call_with_cache(backbone, *args)

        return call_with_cache, backbone.num_heads, backbone.hidden_dim // backbone.num_heads
    return None


def has_cache(backbone: tf.keras.Model) -> bool:
    """Whether `generate` runs `backbone` with a key/value cache (GPT-2, Gemma 3; module doc)."""
    return _cache_layout(backbone) is not None


class _CachedDecoding:
    """The cached prompt pass and single-token step of one backbone, two traced graphs (their
    input signatures leave batch and widths free, so neither retraces per step or batch), and
    the state of the batch being decoded (cache, key positions, lengths, step)."""

    def __init__(self, backbone: tf.keras.Model):
        call_with_cache, heads, width = _cache_layout(backbone)
        layers, dtype = len(backbone.transformer_layers), backbone.compute_dtype
        embedding = backbone.token_embedding
        vector = tf.TensorSpec([None], tf.int32)
        cache_spec = tuple(tf.TensorSpec([None, 2, None, heads, width], dtype)
                           for _ in range(layers))

        def logits_and_best(hidden):
            logits = causal_lm.output_logits(embedding, hidden)
            return logits, tf.argmax(logits, axis=-1, output_type=tf.int32)

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32), vector,
                                      tf.TensorSpec([], tf.int32)])
        def prompt_pass(token_ids, lengths, steps):
            shape = tf.shape(token_ids)
            keys = cache_key_positions(lengths, shape[1], steps)
            cache = tuple(tf.zeros(tf.stack([shape[0], 2, shape[1] + steps, heads, width]),
                                   dtype) for _ in range(layers))
            positions = tf.broadcast_to(tf.range(shape[1])[None, :], shape)
            hidden, cache = call_with_cache(token_ids, cache, 0, positions, keys)
            last = tf.gather(hidden, lengths - 1, axis=1, batch_dims=1)
            return (*logits_and_best(last), keys, cache)

        @tf.function(input_signature=[vector, vector, tf.TensorSpec([], tf.int32),
                                      tf.TensorSpec([None, None], tf.int32), cache_spec])
        def step(tokens, positions, cache_update_index, keys, cache):
            hidden, cache = call_with_cache(tokens[:, None], cache, cache_update_index,
                                            positions[:, None], keys)
            return (*logits_and_best(hidden[:, 0]), cache)

        self._prompt_pass, self._step = prompt_pass, step

    def start(self, rows: Sequence[Sequence[int]], steps: int, pad_id: int
              ) -> tuple[tf.Tensor, tf.Tensor]:
        """Runs the prompts `rows` (a cache for `steps` fed tokens after them): `(logits (B, V),
        argmax (B,))` of each row's next token."""
        self._lengths = np.array([len(r) for r in rows], np.int32)
        self._width = int(self._lengths.max())
        self._fed = 0
        token_ids = _right_padded(rows, self._width, pad_id)
        logits, best, self._keys, self._cache = self._prompt_pass(token_ids, self._lengths,
                                                                   np.int32(steps))
        return logits, best

    def feed(self, tokens: np.ndarray) -> tuple[tf.Tensor, tf.Tensor]:
        """Feeds one token per row (B,) (at position len_b + s, s the number fed before):
        `(logits (B, V), argmax (B,))` of each row's next token."""
        if self._fed + self._width >= int(self._keys.shape[1]):
            raise ValueError(f"the cache has room for {self._fed} fed tokens, all used")
        logits, best, self._cache = self._step(
            np.asarray(tokens, np.int32), self._lengths + self._fed,
            np.int32(self._width + self._fed), self._keys, self._cache)
        self._fed += 1
        return logits, best


def _check_positions(backbone: tf.keras.Model, width: int) -> None:
    """A backbone with a position table (GPT-2) must have a row for every position fed."""
    limit = getattr(backbone, "max_sequence_length", None)
    if limit is not None and width > limit:
        raise ValueError(f"prompt and generated tokens reach {width} positions; the backbone has "
                         f"max_sequence_length={limit}")


def _generate_cached(decoding: _CachedDecoding, rows: list[list[int]], max_new_tokens: int,
                     stops: set[int], pad_id: int) -> list[list[int]]:
    generated: list[list[int]] = [[] for _ in rows]
    active = np.ones(len(rows), bool)
    _, best = decoding.start(rows, max_new_tokens - 1, pad_id)
    for step in range(max_new_tokens):
        tokens = best.numpy()
        for b in np.flatnonzero(active):
            if int(tokens[b]) in stops:
                active[b] = False
            else:
                generated[b].append(int(tokens[b]))
        if step == max_new_tokens - 1 or not active.any():
            break
        _, best = decoding.feed(np.where(active, tokens, pad_id))
    return generated


def _generate_uncached(next_tokens: Callable, rows: list[list[int]], max_new_tokens: int,
                       stops: set[int], pad_id: int) -> list[list[int]]:
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
    return generated


def generate(backbone: tf.keras.Model, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             stop_ids: Sequence[int] = (), pad_id: int = 0, batch_size: int = 32,
             use_cache: bool = True) -> list[list[int]]:
    """The greedy continuation of every prompt (at most `max_new_tokens` tokens each, ending
    before the first token of `stop_ids`, which is not returned), `batch_size` prompts a call.

    With a key/value cache when `use_cache` and `has_cache(backbone)` (GPT-2, Gemma 3: one
    prompt pass, then one position per row and token); otherwise (e.g. Llama) each token reruns
    the backbone on the whole (B, P + n) buffer. Either way row i's continuation is
    `causal_lm.greedy_generate(backbone, prompts[i], max_new_tokens, stop_ids)`
    (`benchmarks.evaluation` times the two ways on Gemma 3 270M)."""
    _check_prompts(prompts)
    if max_new_tokens < 0 or batch_size < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}, batch_size={batch_size}: need "
                         "max_new_tokens ≥ 0 and batch_size ≥ 1")
    if not max_new_tokens:
        return [[] for _ in prompts]
    _check_positions(backbone, max(len(p) for p in prompts) + max_new_tokens - 1)
    stops = {int(s) for s in stop_ids}
    if use_cache and has_cache(backbone):
        decoding, run = _CachedDecoding(backbone), _generate_cached
    else:
        decoding, run = _next_token_fn(backbone), _generate_uncached
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        rows = [list(p) for p in prompts[start:start + batch_size]]
        out.extend(run(decoding, rows, max_new_tokens, stops, pad_id))
    return out


def cached_next_token_logits(backbone: tf.keras.Model, prompts: Sequence[Sequence[int]],
                             continuations: Sequence[Sequence[int]], pad_id: int = 0
                             ) -> list[np.ndarray]:
    """Row i: (len(c_i) + 1, V) float: the next-token logits after p_i + c_i[:k], k = 0..len(c_i),
    from the key/value cache `generate` uses (the prompts in one batch, then the continuations
    fed a token per step: teacher forcing); the uncached backbone's logits at positions
    len(p_i) − 1 .. len(p_i) + len(c_i) − 1 of p_i + c_i, up to float32 rounding.

    >>> import keras_nlp, numpy as np
    >>> backbone = keras_nlp.models.GPT2Backbone(vocabulary_size=20, num_layers=1, num_heads=1,
    ...     hidden_dim=4, intermediate_dim=8, max_sequence_length=16)
    >>> cached = cached_next_token_logits(backbone, [[1, 2, 3], [4]], [[5, 6], [7]])
    >>> [c.shape for c in cached]
    [(3, 20), (2, 20)]
    >>> ids = np.array([[1, 2, 3, 5, 6]], np.int32)
    >>> full = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    >>> bool(np.allclose(cached[0], backbone.token_embedding(full, reverse=True)[0, 2:],
    ...                  atol=1e-5))
    True
    """
    if not has_cache(backbone):
        raise ValueError(f"{type(backbone).__name__} has no key/value cache here (has_cache)")
    if len(prompts) != len(continuations):
        raise ValueError(f"{len(prompts)} prompts for {len(continuations)} continuations")
    _check_prompts(prompts)
    steps = max(len(c) for c in continuations)
    _check_positions(backbone, max(len(p) for p in prompts) + steps)
    decoding = _CachedDecoding(backbone)
    logits, _ = decoding.start([list(p) for p in prompts], steps, pad_id)
    out = [logits.numpy()]
    fed = _right_padded(continuations, steps, pad_id)
    for s in range(steps):
        out.append(decoding.feed(fed[:, s])[0].numpy())
    stacked = np.stack(out, axis=1)   # (B, steps + 1, V)
    return [stacked[i, :len(c) + 1] for i, c in enumerate(continuations)]


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
