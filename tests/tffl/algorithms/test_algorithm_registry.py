"""tffl.algorithms.registry: the one registry. Every name in it builds from its family's config and runs
two communication rounds that change the federated weights. (tests/tffl/runtime/test_distribute.py also
runs every entry, each on the model `runner.algorithms.model_for` gives it.)"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from models.paper_models import RoloraMnistNetConfig, build_rolora_mnist_net
from tffl.algorithms import registry
from tffl.algorithms import lora_plans
from tffl.algorithms import personalized
from tffl.algorithms.lora_plans import FederatedLoraConfig
from tffl.algorithms.personalized_builders import PersonalizedConfig
from tffl.engine.federated_model import ModelSource
from tffl.engine.process import Process

_D, _CLASSES = 8, 3
_SPEC = (tf.TensorSpec([None, _D], tf.float32), tf.TensorSpec([None], tf.int32))
# The LoRA net with a tagged head (personal for the personalized algorithms) and a frozen W0
# linked to the adapter (FLoRA merges into it). LG-FedAvg needs personal lower layers and
# AdaptPFL a shortcut: their own models, in test_distribute.
_ON_THIS_MODEL = ("rolora", "fedavg_lora", "ffa_lora", "flexlora", "flora", "rolora_ffa",
                  "fedrep", "fedper", "fedavg", "fedavg_ft", "fedsa_lora")


def _model_fn():
    return build_rolora_mnist_net(RoloraMnistNetConfig(
        input_dim=_D, rank=2, num_classes=_CLASSES, b_stddev=0.1, trainable_head=True,
        base_kernel=True))


def _datasets(seed):
    rng = np.random.default_rng(seed)
    return [tf.data.Dataset.from_tensor_slices(
        (rng.normal(size=(n, _D)).astype(np.float32),
         rng.integers(0, _CLASSES, size=n).astype(np.int32))).batch(3) for n in (4, 5)]


def test_the_registry_is_the_one_list_of_names():
    assert list(registry.ALGORITHMS) == [*personalized.PERSONALIZED_ALGORITHMS,
                                         *lora_plans.ROUND_BUILDERS,
                                           *registry.LINEAR_BUILDERS]
    assert {a.family for a in registry.ALGORITHMS.values()} == {"lora", "personalized",
                                                                  "linear"}
    assert all(name == entry.name for name, entry in registry.ALGORITHMS.items())
    with pytest.raises(ValueError, match="unknown algorithm 'fedprox'; choose one of fedrep"):
        registry.get("fedprox")


def _source():
    return ModelSource(_model_fn, _SPEC)


def test_every_family_builds_from_its_one_config():
    with pytest.raises(ValueError, match=r"rolora_ffa needs FederatedLoraConfig\(total_rounds=T\)"):
        registry.get("rolora_ffa").build(FederatedLoraConfig(_source(), 0.1))
    with pytest.raises(TypeError,
                       match="takes a tffl.algorithms.lora_plans.FederatedLoraConfig, got dict"):
        registry.get("rolora").build({"seed": 1})
    with pytest.raises(TypeError, match="fedrep takes a tffl.algorithms.personalized_builders."
                                        "PersonalizedConfig, got FederatedLoraConfig"):
        registry.get("fedrep").build(FederatedLoraConfig(_source(), 0.1))
    with pytest.raises(ValueError, match=r"fedrep needs PersonalizedConfig\(model=ModelSource"):
        registry.get("fedrep").build(PersonalizedConfig())
    with pytest.raises(TypeError, match="takes a tffl.algorithms.registry.LinearConfig"):
        registry.get("fedrep_linear").build(FederatedLoraConfig(_source(), 0.1))


def _flat(weights):
    return [np.asarray(w) for w in list(weights.trainable) + list(weights.non_trainable)]


@pytest.mark.parametrize("name", _ON_THIS_MODEL)
def test_every_entry_builds_and_runs_two_rounds(name, tff_runtime):
    entry = registry.get(name)
    config = (FederatedLoraConfig(_source(), 0.1, total_rounds=4) if entry.family == "lora"
              else PersonalizedConfig(model=_source(), client_optimizer=0.1))
    process = entry.build(config)
    state = process.initialize()
    start = _flat(process.get_model_weights(state))
    personal = ([process.initialize_personal(c) for c in ("a", "b")]
                if process.personal is not None else None)
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


# --- the linear family: no Keras model, a LinearConfig ----------------------------------------

_LINEAR_OPTIONS = {"adaptpfl_linear": {"alpha": 0.3}}


def _linear_clients(dim, seed=0, matrix=False):
    """Three clients' {x: (m, d), y: (m,)}; RoLoRA's Alt-min-GD regresses y: (m, d)."""
    rng = np.random.default_rng(seed)
    return [dict(x=rng.normal(size=(m, dim)).astype(np.float32),
                 y=rng.normal(size=(m, dim) if matrix else m).astype(np.float32))
            for m in (6, 9, 7)]


def _leaves(value):
    if hasattr(value, "_asdict"):
        value = value._asdict()
    return [np.asarray(v) for v in tf.nest.flatten(value)]


@pytest.mark.parametrize("name", list(registry.LINEAR_BUILDERS))
def test_every_linear_entry_builds_and_runs_two_rounds(name, tff_runtime):
    rank = 1 if name == "rolora_linear" else 2
    entry = registry.get(name)
    assert entry.family == "linear"
    process = entry.build(registry.LinearConfig(
        dim=5, rank=rank, learning_rate=0.1, seed=1, options=_LINEAR_OPTIONS.get(name, {})))
    # The one process class: the stateless ones pass TFF's LearningProcess checks; the
    # personalized ones declare their personal state.
    assert isinstance(process, Process) and isinstance(process.next, tff.Computation)
    assert (process.personal is None) == (name in ("fedrep_linear", "rolora_linear"))
    state = process.initialize()
    start = _leaves(state)
    personal = ([process.initialize_personal(str(i)) for i in range(3)]
                if process.personal is not None else None)
    for t in range(2):
        data = _linear_clients(5, seed=t, matrix=name == "rolora_linear")
        output = (process.next_round(state, data) if personal is None
                  else process.next_round(state, data, personal))
        state = output.state
        if personal is not None:
            personal = output.personal_states
    assert process.round_num(state) == 2   # communication rounds (Alt-min-GD: B then A)
    metrics = output.metrics if len(process.rounds) == 1 else output.metrics["a_round"]
    assert np.isfinite(metrics["client_work"]["train"]["loss"])
    end = _leaves(state)
    assert all(np.all(np.isfinite(v)) for v in end)
    assert any(v.dtype.kind == "f" and not np.allclose(a, v)
               for a, v in zip(start, end, strict=True)), name


def test_linear_config_is_checked():
    with pytest.raises(TypeError, match="takes a tffl.algorithms.registry.LinearConfig, got dict"):
        registry.get("fedrep_linear").build({"dim": 5})
    with pytest.raises(ValueError, match="rank=2 must be 1"):
        registry.get("rolora_linear").build(registry.LinearConfig(5, 2, 0.1))
