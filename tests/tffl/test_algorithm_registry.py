"""tffl.algorithms: the one registry. Every name in it builds from its family's config and runs
two communication rounds that change the federated weights. (tests/tffl/test_distribute.py also
runs every entry, each on the model `experiments.algorithms.model_for` gives it.)"""

import numpy as np
import pytest
import tensorflow as tf

from models.paper_models import build_rolora_mnist_net
from tffl import algorithms
from tffl import lora_plans
from tffl import personalized

_D, _CLASSES = 8, 3
_SPEC = (tf.TensorSpec([None, _D], tf.float32), tf.TensorSpec([None], tf.int32))
# The LoRA net with a tagged head (personal for the personalized algorithms) and a frozen W0
# linked to the adapter (FLoRA merges into it). LG-FedAvg needs personal lower layers and
# AdaptPFL a shortcut: their own models, in test_distribute.
_ON_THIS_MODEL = ("rolora", "fedavg_lora", "ffa_lora", "flexlora", "flora", "rolora_ffa",
                  "fedrep", "fedper", "fedavg", "fedavg_ft", "fedsa_lora")


def _model_fn():
    return build_rolora_mnist_net(input_dim=_D, rank=2, num_classes=_CLASSES, b_stddev=0.1,
                                  trainable_head=True, base_kernel=True)


def _datasets(seed):
    rng = np.random.default_rng(seed)
    return [tf.data.Dataset.from_tensor_slices(
        (rng.normal(size=(n, _D)).astype(np.float32),
         rng.integers(0, _CLASSES, size=n).astype(np.int32))).batch(3) for n in (4, 5)]


def test_the_registry_is_the_one_list_of_names():
    assert list(algorithms.ALGORITHMS) == [*personalized.ALGORITHMS, *lora_plans.ROUND_BUILDERS]
    assert {a.family for a in algorithms.ALGORITHMS.values()} == {"lora", "personalized"}
    assert all(name == entry.name for name, entry in algorithms.ALGORITHMS.items())
    with pytest.raises(ValueError, match="unknown algorithm 'fedprox'; choose one of fedrep"):
        algorithms.get("fedprox")


def test_lora_config_becomes_the_builders_options():
    config = algorithms.LoraConfig(seed=3, averaging_error=True, weight_decay=0.1)
    assert config.options("flora")["seed"] == 3
    assert "seed" not in config.options("rolora")
    assert config.options("fedavg_lora")["averaging_error"] is True
    assert config.options("fedavg_lora")["weight_decay"] == 0.1
    with pytest.raises(ValueError, match=r"rolora_ffa needs LoraConfig\(total_rounds=T\)"):
        algorithms.get("rolora_ffa").build(_model_fn, _SPEC, 0.1)
    with pytest.raises(TypeError, match="takes a tffl.algorithms.LoraConfig, got dict"):
        algorithms.get("rolora").build(_model_fn, _SPEC, 0.1, {"seed": 1})


def _flat(weights):
    return [np.asarray(w) for w in list(weights.trainable) + list(weights.non_trainable)]


@pytest.mark.parametrize("name", _ON_THIS_MODEL)
def test_every_entry_builds_and_runs_two_rounds(name, tff_runtime):
    entry = algorithms.get(name)
    config = (algorithms.LoraConfig(total_rounds=4) if entry.family == "lora" else None)
    process = entry.build(_model_fn, _SPEC, 0.1, config)
    state = process.initialize()
    start = _flat(process.get_model_weights(state))
    personal = ([process.initialize_personal(c) for c in ("a", "b")]
                if hasattr(process, "initialize_personal") else None)
    for t in range(2):
        args = (state, _datasets(t)) + ((personal,) if personal is not None else ())
        output = process.next_round(*args)
        state = output.state
        if personal is not None:
            personal = output.personal_states
    assert process.round_num(state) == 2
    end = _flat(process.get_model_weights(state))
    assert all(np.all(np.isfinite(w)) for w in end)
    assert any(not np.allclose(a, b) for a, b in zip(start, end, strict=True)), name
