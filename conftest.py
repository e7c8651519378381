"""The names the library's docstring examples use (`--doctest-modules`; tests/conftest.py has the
test suites' own set-up).

One small world for every example: RoLoRA's two-layer net at d = 8, rank 2, 3 classes with a
trainable head (`models.paper_models.build_rolora_mnist_net`), two clients "a" and "b" with 6
examples each in batches of 3, and a RoLoRA process on them. Examples that execute a federated
computation open their own `runtime.local_runtime()`, as a user's code would.
"""

import collections
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402


def _world(tmp_dir) -> dict:
    import numpy as np
    import tensorflow as tf
    import tensorflow_federated as tff

    from models import paper_models
    from tffl import runtime
    from tffl.engine import model_spec
    from tffl.algorithms import lora_fl
    from tffl.engine import roles

    def model_fn():
        return paper_models.build_rolora_mnist_net(paper_models.RoloraMnistNetConfig(
            input_dim=8, rank=2, num_classes=3, b_stddev=0.1, trainable_head=True))

    input_spec = (tf.TensorSpec([None, 8], tf.float32), tf.TensorSpec([None], tf.int32))
    rng = np.random.default_rng(0)

    def datasets(seed):
        g = np.random.default_rng(seed)
        return [tf.data.Dataset.from_tensor_slices(
            (g.normal(size=(6, 8)).astype(np.float32), g.integers(0, 3, size=6).astype(np.int32))
        ).batch(3) for _ in range(2)]

    # The linear examples: y_i = x_i·θ_i* + noise, d = 10, 4 clients of 20 samples (float32).
    xs = [rng.normal(size=(20, 10)).astype(np.float32) for _ in range(4)]
    ys = [(x @ rng.normal(size=10) + 0.01 * rng.normal(size=20)).astype(np.float32) for x in xs]
    return dict(
        np=np, tf=tf, tff=tff, collections=collections, roles=roles, runtime=runtime,
        model_fn=model_fn, input_spec=input_spec,
        spec=model_spec.inspect_model(model_fn, input_spec),
        client_ids=["a", "b"], client_datasets=datasets(1), datasets=datasets(1),
        other_datasets=datasets(2),
        process=lora_fl.build_lora_process("rolora", model_fn, input_spec,
                                           client_optimizer=0.1),
        xs=xs, ys=ys,
        data=[collections.OrderedDict(x=x, y=y) for x, y in zip(xs, ys)],
        run_dir=tmp_dir,
    )


@pytest.fixture(scope="session")
def doctest_namespace(tmp_path_factory):
    """pytest's doctest globals, built once per session (only doctest items request it)."""
    return _world(tmp_path_factory.mktemp("doctest_run"))
