"""The frozen base at a lower precision: weights stored in bfloat16, read widened to float32.

A decoder's frozen projections and embedding table (the base, never trained) are most of its
memory: Gemma 3 270M's are 1.07 GB in float32. With `base_dtype="bfloat16"` each such variable
holds bf16(W), W rounded to bfloat16 (8 bits of mantissa, round to nearest even: relative error
at most 2⁻⁹ per weight, float32's exponent range), half the bytes. Every read inside its layer's
call widens it back, so the step computes in float32 as before, on bf16(W):

    y = x · float32(bf16(W))                 (a projection: Dense / EinsumDense)
    e = float32(bf16(E)[ids])                (the embedding: the rows looked up, then widened)

The LoRA factors, the heads, the norms and every product stay float32 (`trained_dtype`): only
what is never trained is stored low. The tied output projection hidden · float32(bf16(E))ᵀ is
`models.causal_lm.output_logits`', widened a block of rows at a time.

The mechanism is Keras's own mixed-precision machinery with the roles swapped: a `StoredPolicy`
computes in float32 and stores variables in bfloat16, so Keras makes each variable an
`AutoCastVariable` that its layer's `__call__` reads as float32 (and LoRA wrappers, which read
the wrapped kernel inside their own call, too).

>>> import numpy as np
>>> dense = tf.keras.layers.Dense(3, use_bias=False, dtype=frozen_policy("bfloat16"))
>>> x = np.ones((1, 4), np.float32)
>>> y = dense(x)
>>> dense.kernel.dtype.name, y.dtype.name
('bfloat16', 'float32')
>>> stored = tf.cast(tf.cast(dense.kernel.value(), tf.bfloat16), tf.float32)  # bf16(W), widened
>>> bool(np.allclose(y, x @ stored.numpy(), rtol=1e-6))
True
>>> frozen_policy("float32") is None          # the default: the layers' own float32
True
"""

from __future__ import annotations

import tensorflow as tf

# The precisions below float32 a frozen base can be stored at (with "float32", the choices of
# `tasks.task_config.BASE_DTYPES`, which a command line lists without importing TensorFlow).
LOWER_DTYPES = ("bfloat16",)
_PREFIX = "float32_stored_"


@tf.keras.utils.register_keras_serializable(package="tffl")
class StoredPolicy(tf.keras.mixed_precision.Policy):
    """A Keras dtype policy that computes in float32 and stores variables in a lower dtype:
    `StoredPolicy("float32_stored_bfloat16")` (module doc). Its name round-trips through
    `get_config`, so layers built with it serialize.

    >>> policy = StoredPolicy("float32_stored_bfloat16")
    >>> policy.compute_dtype, policy.variable_dtype
    ('float32', 'bfloat16')
    """

    def _parse_name(self, name):
        if not name.startswith(_PREFIX) or name[len(_PREFIX):] not in LOWER_DTYPES:
            raise ValueError(f"StoredPolicy name {name!r}: expected {_PREFIX}<dtype>, <dtype> "
                             f"one of {', '.join(LOWER_DTYPES)}")
        return "float32", name[len(_PREFIX):]


def check_base_dtype(base_dtype: str) -> None:
    """Raises `ValueError` naming `base_dtype` unless it is float32 or one of `LOWER_DTYPES`.

    >>> check_base_dtype("int4")
    Traceback (most recent call last):
    ...
    ValueError: base_dtype='int4': choose one of float32, bfloat16
    """
    choices = ("float32", *LOWER_DTYPES)
    if base_dtype not in choices:
        raise ValueError(f"base_dtype={base_dtype!r}: choose one of {', '.join(choices)}")


def frozen_policy(base_dtype: str) -> StoredPolicy | None:
    """The dtype policy of a frozen layer whose weights are stored at `base_dtype`: None for
    float32 (the layer's default policy), else a `StoredPolicy`."""
    check_base_dtype(base_dtype)
    return None if base_dtype == "float32" else StoredPolicy(_PREFIX + base_dtype)


def trained_dtype(layer: tf.keras.layers.Layer) -> tf.DType:
    """The dtype of values trained beside `layer`'s weights (its LoRA factors): the wider of its
    variables' and its computation's, so float32 beside a bfloat16-stored base and beside a
    mixed-precision layer's float32 variables alike.

    >>> trained_dtype(tf.keras.layers.Dense(2, dtype=frozen_policy("bfloat16"))).name
    'float32'
    >>> trained_dtype(tf.keras.layers.Dense(2)).name
    'float32'
    """
    policy = layer.dtype_policy
    dtypes = [tf.as_dtype(policy.variable_dtype), tf.as_dtype(policy.compute_dtype)]
    return max(dtypes, key=lambda d: d.size)
