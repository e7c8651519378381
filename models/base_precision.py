"""The frozen base at a lower precision: weights stored in bfloat16 or int8, read widened to float32.

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

With `base_dtype="int8"` each such weight takes about a quarter of the bytes: blockwise absmax,
as GGUF's Q8_0. Each output channel j's inputs are cut into blocks of 32 consecutive ones (the
whole channel when the input width is not a multiple of 32), and each block b gets a float32
scale s_bj = max_{i∈b} |W_ij| / 127 and int8 levels q_ij = round(W_ij / s_bj) (round half to
even), so |W_ij − q_ij·s_bj| ≤ s_bj / 2 (`absmax_int8`): 1.125 bytes per weight. The step reads
the kernel widened, float32(q)·s (`Int8Dense`, `Int8EinsumDense`: `widened_kernel`). An
embedding's channel is its row (the tied output projection's output) and its blocks run along
the width, so the lookup widens the rows it gathers and the output projection widens a block
of rows at a time (`models.causal_lm.widened_product`).

bfloat16's mechanism is Keras's own mixed-precision machinery with the roles swapped: a `StoredPolicy`
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

An int8 projection computes the float32 one on its widened kernel, which is within half a
scale step of the kernel it was quantized from:

>>> weights = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
>>> dense = projection("int8", units=3, name="int8_dense", use_bias=False,
...                    kernel_initializer=tf.keras.initializers.Constant(weights))
>>> y = dense(x)
>>> dense.kernel.dtype.name, dense.kernel_scale.shape.as_list(), y.dtype.name
('int8', [1, 3], 'float32')
>>> widened = dense.widened_kernel().numpy()
>>> bool(np.allclose(y, x @ widened, rtol=1e-6))
True
>>> bool(np.all(np.abs(widened - weights) <= dense.kernel_scale.numpy() / 2 + 1e-7))
True
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

# The precisions below float32 a frozen base can be stored at (with "float32", the choices of
# `tasks.task_config.BASE_DTYPES`, which a command line lists without importing TensorFlow).
LOWER_DTYPES = ("bfloat16", "int8")
# The dtypes a `StoredPolicy` stores variables at (int8 needs a scale: `Int8Dense`).
_STORED_DTYPES = ("bfloat16",)
_PREFIX = "float32_stored_"
# int8's levels: q in [−127, 127], symmetric (absmax); and its block of inputs sharing a scale
# (GGUF's Q8_0 block).
INT8_LEVELS = 127
INT8_BLOCK = 32


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
        if not name.startswith(_PREFIX) or name[len(_PREFIX):] not in _STORED_DTYPES:
            raise ValueError(f"StoredPolicy name {name!r}: expected {_PREFIX}<dtype>, <dtype> "
                             f"one of {', '.join(_STORED_DTYPES)}")
        return "float32", name[len(_PREFIX):]


def check_base_dtype(base_dtype: str) -> None:
    """Raises `ValueError` naming `base_dtype` unless it is float32 or one of `LOWER_DTYPES`.

    >>> check_base_dtype("int4")
    Traceback (most recent call last):
    ...
    ValueError: base_dtype='int4': choose one of float32, bfloat16, int8
    """
    choices = ("float32", *LOWER_DTYPES)
    if base_dtype not in choices:
        raise ValueError(f"base_dtype={base_dtype!r}: choose one of {', '.join(choices)}")


def frozen_policy(base_dtype: str) -> StoredPolicy | None:
    """The dtype policy of a frozen layer whose weights are stored at `base_dtype`: a
    `StoredPolicy` for bfloat16, else None (the layer's default float32 policy: an int8 layer
    makes its own int8 variables, `Int8Dense`)."""
    check_base_dtype(base_dtype)
    return StoredPolicy(_PREFIX + base_dtype) if base_dtype in _STORED_DTYPES else None


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


def int8_blocks(size: int) -> int:
    """How many blocks an input axis of `size` is quantized in: blocks of `INT8_BLOCK`, or
    one block (the whole channel) when `size` is not a multiple of it.

    >>> int8_blocks(640), int8_blocks(8)
    (20, 1)
    """
    return size // INT8_BLOCK if size % INT8_BLOCK == 0 else 1


def _grouped_shape(shape, axis: int, blocks: int) -> tuple[int, ...]:
    """`shape` with its `axis` split into (blocks, shape[axis] / blocks)."""
    shape = tuple(int(d) for d in shape)
    return shape[:axis] + (blocks, shape[axis] // blocks) + shape[axis + 1:]


def absmax_int8(weight: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """`(q, s)`: `weight` quantized blockwise along its input `axis` (module doc). The axis is
    cut into `int8_blocks` blocks of consecutive inputs; within each block of each output
    channel, s = max |W| / 127 (float32) and q = round(W / s) as int8 (an all-zero block: s = 1,
    q = 0). q has `weight`'s shape; s has it with `axis` of the blocks' count. Then
    |W − q·s| ≤ s/2 elementwise (`widen`), and each block's largest |W| is exactly ±127·s.

    >>> w = np.array([[1.0, -0.5], [-2.54, 0.25]], np.float32)   # (inputs, outputs)
    >>> q, s = absmax_int8(w, axis=0)                              # one block of 2 inputs
    >>> q.tolist(), s.astype(float).round(5).tolist()
    ([[50, -127], [-127, 64]], [[0.02, 0.00394]])
    >>> q, s = absmax_int8(np.ones((4, 64), np.float32), axis=1)   # blocks of 32 inputs
    >>> q.shape, s.shape
    ((4, 64), (4, 2))
    """
    weight = np.asarray(weight, np.float32)
    if axis != 0 and weight.shape[0] > TABLE_ROWS:   # a table: its rows a slice at a time
        parts = [absmax_int8(weight[start:start + TABLE_ROWS], axis)
                 for start in range(0, weight.shape[0], TABLE_ROWS)]
        return (np.concatenate([q for q, _ in parts]),
                np.concatenate([scale for _, scale in parts]))
    blocks = int8_blocks(weight.shape[axis])
    grouped = weight.reshape(_grouped_shape(weight.shape, axis, blocks))
    absmax = np.max(np.abs(grouped), axis=axis + 1, keepdims=True)
    scale = np.where(absmax > 0, absmax / np.float32(INT8_LEVELS), 1.0).astype(np.float32)
    levels = grouped / scale
    np.clip(np.round(levels, out=levels), -INT8_LEVELS, INT8_LEVELS, out=levels)
    return (np.ascontiguousarray(levels.reshape(weight.shape), np.int8),
            np.ascontiguousarray(np.squeeze(scale, axis + 1)))


# Rows of an embedding table handled at once: quantized by `absmax_int8`, dequantized from a
# checkpoint or drawn (`stored_in_slices`' callers). Their float32 values: 42 MB at Gemma 3
# 270M's width 640, against 671 MB for the whole table.
TABLE_ROWS = 16_384


def _absmax_int8_tensor(weight: tf.Tensor, axis: int):
    """`absmax_int8` in TensorFlow ops, for an initializer drawn inside a graph."""
    shape = tuple(weight.shape)
    grouped = tf.reshape(weight, _grouped_shape(shape, axis, int8_blocks(shape[axis])))
    absmax = tf.reduce_max(tf.abs(grouped), axis=axis + 1, keepdims=True)
    scale = tf.where(absmax > 0, absmax / INT8_LEVELS, tf.ones_like(absmax))
    levels = tf.clip_by_value(tf.round(grouped / scale), -INT8_LEVELS, INT8_LEVELS)
    return tf.cast(tf.reshape(levels, shape), tf.int8), tf.squeeze(scale, axis + 1)


def widen(q, scale, axis: int) -> tf.Tensor:
    """float32(q)·s, each block of `axis` times its scale (`absmax_int8`'s inverse up to the
    rounding): q (..., n, ...) int8, s (..., n / block, ...) -> (..., n, ...) float32. `axis`
    counts from the front; the other dimensions may be unknown until run time (gathered rows).

    >>> w = np.arange(-32, 32, dtype=np.float32).reshape(1, 64)   # blocks -32..-1 and 0..31
    >>> q, s = absmax_int8(w, axis=1)
    >>> (s * 127).round(4).tolist()                                # each block's max |W|
    [[32.0, 31.0]]
    >>> error = np.abs(widen(q, s, axis=1).numpy() - w)
    >>> bool(np.all(error <= np.repeat(s, 32, axis=1) / 2 + 1e-6)), float(error[0, 0])
    (True, 0.0)
    """
    blocks = int(scale.shape[axis])
    width = int(q.shape[axis])
    shape = tf.shape(q)
    grouped = tf.reshape(tf.cast(q, tf.float32), tf.concat(
        [shape[:axis], [blocks, width // blocks], shape[axis + 1:]], 0))
    widened = tf.reshape(grouped * tf.expand_dims(tf.cast(scale, tf.float32), axis + 1), shape)
    widened.set_shape(q.shape)
    return widened


def add_int8_weight(layer: tf.keras.layers.Layer, name: str, shape: tuple[int, ...],
                    initializer, axis: int):
    """`(q, s)`: the int8 variable `name` of `shape` and its float32 scales `name_scale` (one
    per block of input `axis` per output channel), both frozen (not trainable), starting at
    `initializer`'s draw quantized (`absmax_int8`); a zeros initializer starts at q = 0, s = 1
    without a draw. A checkpoint's values replace them (`models.gguf_checkpoint.gguf_values`)."""
    initializer = tf.keras.initializers.get(initializer)
    shape = tuple(int(d) for d in shape)
    scale_shape = shape[:axis] + (int8_blocks(shape[axis]),) + shape[axis + 1:]
    zeros = isinstance(initializer, tf.keras.initializers.Zeros)
    drawn = []   # one draw of the kernel for both variables

    def quantized(index):
        def initial(*_, **__):
            if zeros:
                return (tf.zeros(shape, tf.int8), tf.ones(scale_shape, tf.float32))[index]
            if not drawn:
                drawn.extend(_absmax_int8_tensor(initializer(shape, tf.float32), axis))
            return drawn[index]
        return initial

    q = layer.add_weight(name=name, shape=shape, dtype=tf.int8, initializer=quantized(0),
                         trainable=False)
    scale = layer.add_weight(name=f"{name}_scale", shape=scale_shape, dtype=tf.float32,
                             initializer=quantized(1), trainable=False)
    return q, scale


def stored_in_slices(variable, scale, rows, step: int) -> dict:
    """`{ref: value}`: `variable`'s value at its stored dtype (bfloat16: rounded to nearest)
    and, with its int8 `scale` (None otherwise), its levels and scales (`absmax_int8` along
    `scale_axis`), from the float32 values `rows(start, stop)` gives a slice of `step` rows at a
    time (a table's `TABLE_ROWS`). Beside the stored value, one slice's float32 values are held
    at a time, not the whole weight's (a table of 262,144 rows is 0.7-1.2 GB in float32). Each
    slice holds whole blocks: a table's run along its columns; a kernel, whose blocks may run
    along its rows, comes as one slice (`step` = its rows).

    >>> w = np.arange(-64, 64, dtype=np.float32).reshape(2, 64)
    >>> q = tf.Variable(tf.zeros((2, 64), tf.int8)); s = tf.Variable(tf.ones((2, 2)))
    >>> values = stored_in_slices(q, s, lambda start, stop: w[start:stop], step=1)
    >>> whole = absmax_int8(w, axis=1)   # the same as the whole weight at once
    >>> [bool(np.array_equal(values[v.ref()], part)) for v, part in zip((q, s), whole)]
    [True, True]
    """
    shape = tuple(int(d) for d in variable.shape)
    stored = np.empty(shape, variable.dtype.as_numpy_dtype)
    if scale is not None:
        scales = np.empty(tuple(int(d) for d in scale.shape), np.float32)
        axis = scale_axis(variable, scale)
    for start in range(0, shape[0], step):
        value = rows(start, min(start + step, shape[0]))
        end = start + len(value)
        if scale is None:
            stored[start:end] = value
        else:
            stored[start:end], scales[start:end] = absmax_int8(value, axis)
    if scale is None:
        return {variable.ref(): stored}
    return {variable.ref(): stored, scale.ref(): scales}


@tf.keras.utils.register_keras_serializable(package="tffl")
class Int8Dense(tf.keras.layers.Dense):
    """A `Dense` without bias whose kernel W (d_in, d_out) is stored as int8 (module doc):
    `kernel` int8, `kernel_scale` (d_in / 32, d_out) float32 (one scale per block of 32 inputs
    per output; (1, d_out) when d_in is not a multiple of 32), both frozen. `call(x) =
    activation(x · widened_kernel())`, `widen`ed. LoRA wrappers read `widened_kernel()` through
    `kernel_value`. Its config is `Dense`'s."""

    def __init__(self, units, use_bias=False, **kwargs):
        if use_bias:
            raise ValueError("Int8Dense has no bias: pass use_bias=False (a frozen base's "
                             "projections have none)")
        super().__init__(units, use_bias=False, **kwargs)

    def build(self, input_shape):
        d_in = int(tf.TensorShape(input_shape)[-1])
        self.kernel, self.kernel_scale = add_int8_weight(
            self, "kernel", (d_in, self.units), self.kernel_initializer, axis=0)
        self.bias = None
        self.input_spec = tf.keras.layers.InputSpec(min_ndim=2, axes={-1: d_in})
        self.built = True

    def widened_kernel(self) -> tf.Tensor:
        return widen(self.kernel, self.kernel_scale, axis=0)

    def call(self, inputs):
        kernel = self.widened_kernel()
        if inputs.shape.rank == 2:
            outputs = tf.matmul(inputs, kernel)
        else:
            outputs = tf.tensordot(inputs, kernel, [[inputs.shape.rank - 1], [0]])
        return outputs if self.activation is None else self.activation(outputs)


@tf.keras.utils.register_keras_serializable(package="tffl")
class Int8EinsumDense(tf.keras.layers.EinsumDense):
    """An `EinsumDense` without bias whose kernel is stored as int8 (module doc): its one axis
    contracted with the input (`input_axis`; m of "bqm,muh->bquh") is quantized in blocks, for
    each output channel (u, h), so `kernel_scale` is the kernel's shape with that axis of the
    blocks' count. `call(x) = activation(einsum(equation, x, widened_kernel()))`."""

    def __init__(self, equation, output_shape, bias_axes=None, **kwargs):
        if bias_axes is not None:
            raise ValueError("Int8EinsumDense has no bias: pass bias_axes=None")
        super().__init__(equation, output_shape, bias_axes=None, **kwargs)

    def build(self, input_shape):
        from keras.src.layers.core.einsum_dense import _analyze_einsum_string

        input_shape = tf.TensorShape(input_shape)
        kernel_shape, _, self.full_output_shape = _analyze_einsum_string(
            self.equation, None, input_shape, self.partial_output_shape)
        inputs, kernel = self.equation.split("->")[0].split(",")
        contracted = [i for i, letter in enumerate(kernel) if letter in inputs]
        if len(contracted) != 1:
            raise ValueError(f"Int8EinsumDense {self.equation!r}: its kernel must share exactly "
                             "one axis with the input (the axis quantized in blocks)")
        self.input_axis = contracted[0]
        self.kernel, self.kernel_scale = add_int8_weight(
            self, "kernel", tuple(kernel_shape), self.kernel_initializer, self.input_axis)
        self.bias = None
        self.built = True

    def widened_kernel(self) -> tf.Tensor:
        return widen(self.kernel, self.kernel_scale, self.input_axis)

    def call(self, inputs):
        outputs = tf.einsum(self.equation, inputs, self.widened_kernel())
        return outputs if self.activation is None else self.activation(outputs)


def projection(base_dtype: str, equation: str | None = None, **kwargs) -> tf.keras.layers.Layer:
    """A frozen projection whose kernel is stored at `base_dtype`: a `Dense` (`equation` None)
    or an `EinsumDense` of `equation`, built with `kwargs` (no bias); int8: `Int8Dense` /
    `Int8EinsumDense`, else the Keras layer with `frozen_policy(base_dtype)`."""
    check_base_dtype(base_dtype)
    if base_dtype == "int8":
        return Int8Dense(**kwargs) if equation is None else Int8EinsumDense(equation, **kwargs)
    kwargs["dtype"] = frozen_policy(base_dtype)
    return (tf.keras.layers.Dense(**kwargs) if equation is None
            else tf.keras.layers.EinsumDense(equation, **kwargs))


def kernel_value(layer: tf.keras.layers.Layer):
    """The kernel `layer` computes with: an int8 layer's `widened_kernel()`, else its `kernel`
    (a bfloat16 one read as float32 inside a float32 layer's call, Keras's autocast)."""
    widened = getattr(layer, "widened_kernel", None)
    return layer.kernel if widened is None else widened()


def int8_scales(model: tf.keras.layers.Layer) -> dict:
    """`{id(q): s}`: every int8 variable of `model` (an `Int8Dense` / `Int8EinsumDense` kernel,
    an int8 `Gemma3Embedding` table) with its scale variable."""
    pairs = {}
    for layer in model.submodules:
        for name in ("kernel", "embeddings"):
            q, scale = getattr(layer, name, None), getattr(layer, f"{name}_scale", None)
            if q is not None and scale is not None and q.dtype == tf.int8:
                pairs[id(q)] = scale
    return pairs


def scale_axis(q, scale) -> int:
    """The input axis of an int8 variable `q` quantized in blocks (`absmax_int8`): the one where
    its `scale`'s shape differs (0 when none does: one input, one block)."""
    differing = [i for i, (a, b) in enumerate(zip(q.shape, scale.shape)) if a != b]
    return differing[0] if differing else 0
