"""The small models of the papers, with variable roles.

- `build_rolora_mnist_net(RoloraMnistNetConfig(...))`: RoLoRA's toy f(x) = ReLU(x·A·B)·W_out
  (`rolora.md` §2.5): A (784×16, Gaussian, `lora_a`), B (16×784, zeros, `lora_b`), W_out
  (784×10, fixed, `frozen`); no W0. `linear=True` drops the ReLU (NeurIPS Figure 6). With the
  ReLU, B = 0 gives exactly zero gradients (ReLU'(0) = 0): pass `b_stddev=1e-3` (B ~ N(0, 1e-6))
  to train it. `base_kernel=True` adds a frozen zero W0 (x·(W0 + A·B)) that FLoRA merges the
  adapter into.
- `build_lenet_cnn`: FedRep/SRPFL/FLUTE CIFAR CNN (`srpfl.md` §7.3, `flute.md` §6.2):
  conv1 (5×5, c1) → ReLU → maxpool 2 → conv2 (5×5, c2) → ReLU → maxpool 2 → flatten →
  fc1 → ReLU → fc2 → ReLU [→ Dropout] → fc3 (logits). CIFAR-10: c=(64, 64), fc=(120, 64);
  CIFAR-100: c=(64, 128), fc=(256, 128), Dropout 0.6 before the head.
- `build_mlp`: (FE)MNIST MLP 784 → 512 → 256 → 64 → num_classes with ReLU.

All return logits (use `from_logits=True` losses; the authors' code feeds log-softmax / softmax
outputs to its losses instead). Roles for `split="fedrep"` (FedRep / FedPer / FLUTE / SRPFL):
the last layer is `head`, the rest `shared`. For `split="lg"` (LG-FedAvg): the last two dense
layers are `shared` (global) and the lower layers are personal, tagged `head`.
"""

import dataclasses

import tensorflow as tf

from tffl.engine import roles


class LowRankDense(tf.keras.layers.Layer):
    """y = x·A·B with A (d_in×r, `lora_a`, Gaussian N(0, σ²)) and B (r×units, `lora_b`, zeros,
    or N(0, `b_stddev`²) when `b_stddev` > 0, seeded by `seed` + 2).

    With `base_kernel=True`, y = x·(W0 + A·B) with W0 (d_in×units) zeros and frozen (role
    `frozen`, non-trainable from creation), linked to (A, B) by `tffl.engine.roles.link_lora` with
    scale 1, so that FLoRA can merge the adapter into it.

    Example:

    >>> layer = LowRankDense(units=6, rank=2, seed=0)
    >>> layer(tf.ones((3, 4))).shape
    TensorShape([3, 6])
    """

    def __init__(self, units: int, rank: int, stddev: float = 0.02, seed: int | None = None,
                 b_stddev: float = 0.0, base_kernel: bool = False, **kwargs):
        super().__init__(**kwargs)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
            raise ValueError(f"LoRA rank must be a positive integer, got rank={rank!r}.")
        if not b_stddev >= 0:
            raise ValueError(f"b_stddev must be >= 0, got b_stddev={b_stddev!r}.")
        self.units, self.rank, self.stddev, self.seed = int(units), rank, float(stddev), seed
        self.b_stddev = float(b_stddev)
        self.base_kernel = bool(base_kernel)

    def build(self, input_shape):
        d_in = int(input_shape[-1])
        if self.rank > min(d_in, self.units):
            raise ValueError(
                f"LoRA rank={self.rank} exceeds min(d_in, d_out)=min({d_in}, {self.units})."
            )
        self.lora_a = self.add_weight(
            name="lora_a", shape=(d_in, self.rank),
            initializer=tf.keras.initializers.RandomNormal(stddev=self.stddev, seed=self.seed),
        )
        b_init = ("zeros" if self.b_stddev == 0 else tf.keras.initializers.RandomNormal(
            stddev=self.b_stddev, seed=None if self.seed is None else self.seed + 2))
        self.lora_b = self.add_weight(name="lora_b", shape=(self.rank, self.units),
                                      initializer=b_init)
        roles.tag(self.lora_a, roles.LORA_A)
        roles.tag(self.lora_b, roles.LORA_B)
        self.kernel = None
        if self.base_kernel:
            self.kernel = self.add_weight(name="kernel", shape=(d_in, self.units),
                                          initializer="zeros", trainable=False)
            roles.tag(self.kernel, roles.FROZEN)
            roles.link_lora(self.lora_a, self.lora_b, self.kernel, 1.0)
        self.built = True

    def call(self, inputs):
        outputs = tf.matmul(tf.matmul(inputs, self.lora_a), self.lora_b)
        if self.kernel is not None:
            outputs = tf.matmul(inputs, self.kernel) + outputs
        return outputs

    def get_config(self):
        config = super().get_config()
        config.update(units=self.units, rank=self.rank, stddev=self.stddev, seed=self.seed,
                      b_stddev=self.b_stddev, base_kernel=self.base_kernel)
        return config


class FixedLinear(tf.keras.layers.Layer):
    """y = x·W with W (d_in×units) created non-trainable (role `frozen`, Glorot-uniform, seeded).

    The variable is non-trainable from creation (not frozen afterwards), which TFF's
    `functional_model_from_keras` requires.

    Example:

    >>> layer = FixedLinear(3, seed=0)
    >>> layer(tf.ones((2, 5))).shape, layer.trainable_weights
    (TensorShape([2, 3]), [])
    """

    def __init__(self, units: int, seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.units, self.seed = int(units), seed

    def build(self, input_shape):
        self.kernel = self.add_weight(
            name="kernel", shape=(int(input_shape[-1]), self.units), trainable=False,
            initializer=tf.keras.initializers.GlorotUniform(seed=self.seed),
        )
        roles.tag(self.kernel, roles.FROZEN)
        self.built = True

    def call(self, inputs):
        return tf.matmul(inputs, self.kernel)

    def get_config(self):
        config = super().get_config()
        config.update(units=self.units, seed=self.seed)
        return config


class ShortcutMix(tf.keras.layers.Layer):
    """AdaptPFL's mix of the representation path and the personal shortcut:
    y = (1 − α)·main + α·shortcut, α ∈ [0, 1] fixed (adaptpfl.md §1.2, θ_i = (1−α)Bw_i + α s_i).

    With α = 0 the output is `main` exactly (bit for bit), so AdaptPFL reduces to FedRep.

    Example:

    >>> ShortcutMix(0.25)([tf.ones((1, 2)), tf.zeros((1, 2))]).numpy()
    array([[0.75, 0.75]], dtype=float32)
    """

    def __init__(self, alpha: float, **kwargs):
        super().__init__(**kwargs)
        alpha = float(alpha)
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"shortcut alpha={alpha} must be in [0, 1] (0: FedRep's model, "
                             "1: the shortcut alone)")
        self.alpha = alpha

    def call(self, inputs):
        main, shortcut = inputs
        return (1.0 - self.alpha) * main + self.alpha * shortcut

    def get_config(self):
        config = super().get_config()
        config.update(alpha=self.alpha)
        return config


@dataclasses.dataclass(frozen=True)
class RoloraMnistNetConfig:
    """The shape and initialization of RoLoRA's two-layer MNIST net (`build_rolora_mnist_net`);
    the defaults are the paper's.

    Attributes:
      input_dim: d, the input width (and the width of the LoRA layer's output).
      rank: r of A (d×r) and B (r×d).
      num_classes: the logits' width.
      a_stddev: A ~ N(0, a_stddev²).
      linear: drop the ReLU (NeurIPS Figure 6).
      seed: seeds A, B and W_out (or the trainable head).
      b_stddev: B ~ N(0, b_stddev²); 0 (the paper's B = 0) cannot train the ReLU net.
      base_kernel: add a frozen zero W0 linked to the adapter (FLoRA merges into it).
      trainable_head: a trainable Dense head tagged `head` instead of the fixed W_out.
    """

    input_dim: int = 784
    rank: int = 16
    num_classes: int = 10
    a_stddev: float = 0.02
    linear: bool = False
    seed: int = 0
    b_stddev: float = 0.0
    base_kernel: bool = False
    trainable_head: bool = False


def build_rolora_mnist_net(config: RoloraMnistNetConfig = RoloraMnistNetConfig()
                           ) -> tf.keras.Model:
    """RoLoRA's two-layer MNIST net: logits = ReLU(x·A·B)·W_out, W_out fixed (Glorot, `seed`);
    the net's fields are `config`'s (`RoloraMnistNetConfig`, by default the paper's).

    `trainable_head=True` makes the output layer a trainable Dense (kernel and bias, Glorot
    `seed + 1`) tagged `head`: the personalized algorithms' model with a LoRA representation
    (`tffl.algorithms.personalized`, FedRep heads over RoLoRA-averaged adapters).

    A ~ N(0, `a_stddev`²); B = 0 by default, as the paper states. With the ReLU that init cannot
    train: h = x·A·B = 0 and ReLU'(0) = 0, so ∂ℓ/∂h = 0 and ∇_B ℓ = (x·A)ᵀ·∂ℓ/∂h = 0,
    ∇_A ℓ = xᵀ·(∂ℓ/∂h)·Bᵀ = 0 exactly, for every batch. Pass a small `b_stddev` (e.g. 1e-3,
    B ~ N(0, b_stddev²)) to train the ReLU net; `linear=True` trains from B = 0 (∇_B ≠ 0).
    `base_kernel=True` adds a frozen zero W0 (hidden = ReLU(x·(W0 + A·B))) linked to the adapter:
    FLoRA (`tffl.algorithms.lora_fl.build_flora`) needs it to merge into (it resets B to 0 every round, so
    with the ReLU it trains only once W0 ≠ 0, i.e. from an initial B ≠ 0: `b_stddev` > 0).

    Example:

    >>> model = build_rolora_mnist_net()
    >>> [(v.shape.as_list(), roles.role_of(v)) for v in model.weights]
    [([784, 16], 'lora_a'), ([16, 784], 'lora_b'), ([784, 10], 'frozen')]
    >>> small = build_rolora_mnist_net(RoloraMnistNetConfig(input_dim=8, rank=2, num_classes=3,
    ...                                                     trainable_head=True))
    >>> [(v.shape.as_list(), roles.role_of(v)) for v in small.weights]
    [([8, 2], 'lora_a'), ([2, 8], 'lora_b'), ([8, 3], 'head'), ([3], 'head')]
    """
    input_dim, seed = config.input_dim, config.seed
    inputs = tf.keras.Input(shape=(input_dim,), name="pixels")
    hidden = LowRankDense(input_dim, config.rank, stddev=config.a_stddev, seed=seed,
                          b_stddev=config.b_stddev, base_kernel=config.base_kernel,
                          name="lora")(inputs)
    if not config.linear:
        hidden = tf.keras.layers.ReLU(name="relu")(hidden)
    if config.trainable_head:
        head = tf.keras.layers.Dense(
            config.num_classes, name="head",
            kernel_initializer=tf.keras.initializers.GlorotUniform(seed + 1))
        logits = head(hidden)
        roles.tag_layer(head, roles.HEAD)
    else:
        logits = FixedLinear(config.num_classes, seed=seed + 1, name="w_out")(hidden)
    return tf.keras.Model(inputs, logits, name="rolora_mnist")


def _tag_split(layers: list[tf.keras.layers.Layer], split: str) -> None:
    if split == "fedrep":
        personal = layers[-1:]
    elif split == "lg":
        personal = layers[:-2]
    else:
        raise ValueError(f"Unknown split {split!r}; expected 'fedrep' or 'lg'.")
    for layer in layers:
        roles.tag_layer(layer, roles.HEAD if layer in personal else roles.SHARED)


def build_lenet_cnn(
    num_classes: int = 10,
    variant: str = "cifar10",
    input_shape: tuple[int, int, int] = (32, 32, 3),
    split: str = "fedrep",
    seed: int = 0,
) -> tf.keras.Model:
    """The FedRep / SRPFL / FLUTE CIFAR CNN (see module docstring); weights named conv1..fc3.

    Example:

    >>> model = build_lenet_cnn()
    >>> [l.name for l in model.layers if l.weights]
    ['conv1', 'conv2', 'fc1', 'fc2', 'fc3']
    >>> model.get_layer("fc1").kernel.shape  # 64 channels * 5 * 5 = 1600
    TensorShape([1600, 120])
    """
    if variant == "cifar10":
        channels, units, dropout = (64, 64), (120, 64), 0.0
    elif variant == "cifar100":
        channels, units, dropout = (64, 128), (256, 128), 0.6
    else:
        raise ValueError(f"Unknown CNN variant {variant!r}; expected 'cifar10' or 'cifar100'.")
    init = tf.keras.initializers.GlorotUniform
    conv1 = tf.keras.layers.Conv2D(channels[0], 5, activation="relu", name="conv1",
                                   kernel_initializer=init(seed))
    conv2 = tf.keras.layers.Conv2D(channels[1], 5, activation="relu", name="conv2",
                                   kernel_initializer=init(seed + 1))
    fc1 = tf.keras.layers.Dense(units[0], activation="relu", name="fc1",
                                kernel_initializer=init(seed + 2))
    fc2 = tf.keras.layers.Dense(units[1], activation="relu", name="fc2",
                                kernel_initializer=init(seed + 3))
    fc3 = tf.keras.layers.Dense(num_classes, name="fc3", kernel_initializer=init(seed + 4))
    inputs = tf.keras.Input(shape=input_shape, name="image")
    x = tf.keras.layers.MaxPooling2D(2, name="pool1")(conv1(inputs))
    x = tf.keras.layers.MaxPooling2D(2, name="pool2")(conv2(x))
    x = tf.keras.layers.Flatten(name="flatten")(x)
    x = fc2(fc1(x))
    if dropout:
        x = tf.keras.layers.Dropout(dropout, seed=seed, name="dropout")(x)
    logits = fc3(x)
    _tag_split([conv1, conv2, fc1, fc2, fc3], split)
    return tf.keras.Model(inputs, logits, name=f"lenet_{variant}")


def build_mlp(
    input_dim: int = 784,
    hidden: tuple[int, ...] = (512, 256, 64),
    num_classes: int = 10,
    split: str = "fedrep",
    seed: int = 0,
    shortcut_alpha: float | None = None,
) -> tf.keras.Model:
    """The (FE)MNIST MLP: layer_input → layer_hidden1 → layer_hidden2 (ReLU) → layer_out.

    `shortcut_alpha=α` adds AdaptPFL's personal shortcut (adaptpfl.md §1.2): a linear map
    `shortcut` from the input to the logits (no bias, zero at init, role `shortcut`), and outputs
    (1 − α)·MLP(x) + α·shortcut(x) (`ShortcutMix`); α must be in [0, 1].

    Example:

    >>> model = build_mlp()
    >>> [tuple(l.kernel.shape) for l in model.layers if l.weights]
    [(784, 512), (512, 256), (256, 64), (64, 10)]
    """
    names = ["layer_input", "layer_hidden1", "layer_hidden2"][: len(hidden)]
    if len(hidden) != 3:
        names = [f"layer_hidden{i}" for i in range(len(hidden))]
    dense = [
        tf.keras.layers.Dense(units, activation="relu", name=name,
                              kernel_initializer=tf.keras.initializers.GlorotUniform(seed + i))
        for i, (units, name) in enumerate(zip(hidden, names))
    ]
    dense.append(tf.keras.layers.Dense(
        num_classes, name="layer_out",
        kernel_initializer=tf.keras.initializers.GlorotUniform(seed + len(hidden)),
    ))
    inputs = tf.keras.Input(shape=(input_dim,), name="pixels")
    x = inputs
    for layer in dense:
        x = layer(x)
    _tag_split(dense, split)
    if shortcut_alpha is not None:
        mix = ShortcutMix(shortcut_alpha, name="mix")  # validates α before anything is built
        shortcut = tf.keras.layers.Dense(num_classes, use_bias=False, name="shortcut",
                                         kernel_initializer="zeros")
        x = mix([x, shortcut(inputs)])
        roles.tag_layer(shortcut, roles.SHORTCUT)
    return tf.keras.Model(inputs, x, name="mlp")
