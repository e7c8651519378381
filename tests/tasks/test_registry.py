"""scripts/registry: flag names -> tasks whose client data the round loop can rely on."""

import numpy as np
import pytest

from scripts import registry


def _batches(ds):
    return [(x.numpy(), y.numpy()) for x, y in ds]


def test_client_rounds_take_exactly_local_steps_batches_deterministically():
    task = registry.build_task("digits", num_clients=5, batch_size=7, local_steps=4, seed=3)
    assert len(task.client_ids) == 5
    cid = task.client_ids[2]
    a = _batches(task.client_dataset_fn(cid, 1))
    b = _batches(task.client_dataset_fn(cid, 1))
    c = _batches(task.client_dataset_fn(cid, 2))
    assert len(a) == 4 and all(x.shape == (7, 64) for x, _ in a)
    assert all(np.array_equal(x1, x2) for (x1, _), (x2, _) in zip(a, b))  # same (seed, round)
    assert not all(np.array_equal(x1, x2) for (x1, _), (x2, _) in zip(a, c))  # next round differs


def test_shards_partition_gives_k_classes_per_client():
    task = registry.build_task("digits", num_clients=10, batch_size=500, local_steps=1, seed=0,
                               partition="shards", classes_per_client=2)
    for cid in task.client_ids:
        (_, y), = _batches(task.client_dataset_fn(cid, 1))
        assert len(np.unique(y)) == 2


def test_mnist_from_shared_data(shared_data):
    task = registry.build_task("mnist", num_clients=20, batch_size=8, local_steps=2, seed=0,
                               data_dir=shared_data)
    (x, y), _ = _batches(task.client_dataset_fn(task.client_ids[0], 1))
    assert x.shape == (8, 784) and 0.0 <= x.min() and x.max() <= 1.0
    assert "mnist" in task.description


def test_unknown_names_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        registry.build_task("nope", 2, 1, 1, 0)
    with pytest.raises(ValueError, match="unknown partition 'nope'"):
        registry.build_task("digits", 2, 1, 1, 0, partition="nope")
    with pytest.raises(FileNotFoundError, match="mnist_5k.csv.gz"):
        registry.build_task("mnist", 2, 1, 1, 0, data_dir=tmp_path)


def test_personalized_wiring():
    assert registry.model_for("fedrep") == "pfl_mlp"
    assert registry.model_for("lg_fedavg") == "pfl_mlp_lg"
    assert registry.model_for("fedper", "lora_alternating") == "lora_head_net"


def test_optimizers_by_name():
    """The flags' optimizers are `tff.learning.optimizers`: one step of each on w = 1, g = 2
    gives the textbook update (SGD: w − ηg; momentum β: the same first step; Adam: the first
    step is w − η·sign(g), up to ε)."""
    import tensorflow as tf
    import tensorflow_federated as tff

    w, g = [tf.constant([1.0])], [tf.constant([2.0])]
    for name, momentum, expected in (("sgd", 0.0, 1.0 - 0.1 * 2.0), ("sgd", 0.9, 1.0 - 0.1 * 2.0),
                                     ("adam", 0.0, 1.0 - 0.1)):
        optimizer = registry.build_optimizer(name, 0.1, momentum)
        assert isinstance(optimizer, tff.learning.optimizers.Optimizer)
        state = optimizer.initialize([tf.TensorSpec([1], tf.float32)])
        _, new = optimizer.next(state, w, g)
        np.testing.assert_allclose(new[0].numpy(), [expected], rtol=1e-6)
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        registry.build_optimizer("lion", 0.1)
    with pytest.raises(ValueError, match="momentum applies to the sgd optimizer only"):
        registry.build_optimizer("adam", 0.1, 0.9)


def test_samplers_by_name():
    task = registry.build_task("digits", 8, 4, 1, 0)
    srpfl = registry.build_sampler(task, 8, 0, kind="srpfl", initial_participants=2,
                                   stage_rounds=3)
    assert [len(srpfl.sample(t).client_ids) for t in (1, 3, 4, 7)] == [2, 2, 4, 8]
    full = registry.build_sampler(task, 3, 0, kind="full", straggler="dynamic")
    assert len(full.sample(1).client_ids) == 8 and full.sample(2).info["simulated_time"] > 0
    assert len(registry.build_sampler(task, 3, 0).sample(1).client_ids) == 3
    with pytest.raises(ValueError, match="unknown participation 'some'"):
        registry.build_sampler(task, 3, 0, kind="some")
    with pytest.raises(ValueError, match="unknown straggler model 'slow'"):
        registry.build_sampler(task, 3, 0, kind="full", straggler="slow")


def _minilm_or_skip():
    from models import checkpoints

    try:
        return checkpoints.fetch_minilm()
    except Exception as e:  # no network and no cache
        pytest.skip(f"all-MiniLM-L6-v2 (its vocabulary) is not available: {e}")


def test_review_domains_are_clients_with_ordered_text_features(shared_data):
    import collections

    _minilm_or_skip()
    task = registry.build_task("reviews", num_clients=10, batch_size=4, local_steps=2, seed=0,
                               data_dir=shared_data, sequence_length=16, prefix_cache=False,
                               bucket_by_length=False)
    assert sorted(task.client_ids) == sorted(
        f"{d}_{j}" for d in ("airline", "books", "dvd", "electronics", "kitchen") for j in (0, 1))
    x, y = next(iter(task.client_dataset_fn(task.client_ids[0], 1)))
    # TFF serializes named elements only as OrderedDicts with sorted keys.
    assert isinstance(x, collections.OrderedDict)
    assert list(x) == ["padding_mask", "segment_ids", "token_ids"]
    assert x["token_ids"].shape == (4, 16) and set(np.unique(y.numpy())) <= {0, 1}
    # The default: the tiny BERT adapts every layer, so only the embeddings are cached, and the
    # clients get h_0 (width 64) in batches cut to their longest example.
    cached = registry.build_task("reviews", num_clients=10, batch_size=4, local_steps=2, seed=0,
                                 data_dir=shared_data, sequence_length=16)
    batches = list(cached.client_dataset_fn(task.client_ids[0], 1))
    assert len(batches) == 2
    for (h, y2) in batches:
        assert list(h) == ["hidden", "padding_mask"]
        assert h["hidden"].shape[0] == 4 and h["hidden"].shape[2] == 64
        assert h["hidden"].shape[1] == int(np.max(np.sum(h["padding_mask"], axis=1))) <= 16
    assert "embeddings cached" in cached.description
    ids, train, test = task.client_eval_data()
    assert ids == task.client_ids and len(train) == len(test) == 10
    with pytest.raises(ValueError, match="multiple of 5"):
        registry.build_task("reviews", num_clients=7, batch_size=4, local_steps=1, seed=0,
                            data_dir=shared_data)


def test_minilm_pretrained_weights_fit_the_adapted_architecture(shared_data):
    """The frozen weights loaded eagerly from the checkpoint line up, tensor by tensor, with the
    architecture the processes build in their graphs (same order and shapes)."""
    import tensorflow as tf

    from models import hf_bert

    folder = _minilm_or_skip()
    task = registry.build_task("sst2", num_clients=3, batch_size=4, local_steps=1, seed=0,
                               data_dir=shared_data, backbone="minilm", sequence_length=16,
                               rank=2, prefix_cache=False)
    pretrained = task.pretrained_non_trainable()
    with tf.Graph().as_default():
        model = task.keras_model_fn()
        shapes = [tuple(v.shape.as_list()) for v in model.non_trainable_variables]
        trainable = [v.name for v in model.trainable_variables]
    assert [p.shape for p in pretrained] == shapes
    assert all("lora" in n or "head" in n for n in trainable)
    # The word embeddings are the checkpoint's, not a random init.
    backbone, _ = hf_bert.load_hf_bert(folder)
    embeddings = backbone.get_layer("token_embedding").embeddings.numpy()
    assert any(p.shape == embeddings.shape and np.array_equal(p, embeddings) for p in pretrained)
    # With the prefix cache (LoRA on layers 3-5), the clients' model starts at layer 3: its
    # frozen weights are the checkpoint's layers 3-5 and pooler, and no embeddings.
    cached = registry.build_task("sst2", num_clients=3, batch_size=4, local_steps=1, seed=0,
                                 data_dir=shared_data, backbone="minilm", sequence_length=16,
                                 rank=2, lora_layers=(3, 4, 5))
    assert "embeddings and layers < 3 cached" in cached.description
    suffix_frozen = cached.pretrained_non_trainable()
    with tf.Graph().as_default():
        model = cached.keras_model_fn()
        assert [tuple(v.shape.as_list()) for v in model.non_trainable_variables] == [
            p.shape for p in suffix_frozen]
    assert not any(p.shape == embeddings.shape for p in suffix_frozen)
    layer_3_query = backbone.transformer_layers[3]._self_attention_layer._query_dense.kernel
    assert any(np.array_equal(p, layer_3_query.numpy()) for p in suffix_frozen)


def test_per_client_accuracies_average_to_the_pooled_ones(tmp_path):
    """--eval_per_client: FedRep's per-client accuracies (each client with its own head) average
    to the TFF evaluation's mean client accuracy; FedAvg's global model evaluated per client by
    a Keras evaluator gives the same per-client numbers as the TFF evaluation of that model."""
    from tffl import runtime
    from tffl import simulation

    task = registry.build_task("digits", num_clients=3, batch_size=16, local_steps=2, seed=1,
                               model="pfl_mlp")
    ids = task.client_ids
    with runtime.local_runtime():
        for name in ("fedrep", "fedavg"):
            process = registry.build_algorithm(name, task, client_learning_rate=0.5)
            result = simulation.run_rounds(
                process, registry.build_sampler(task, 3, 0), task.client_dataset_fn, rounds=1,
                output_dir=tmp_path / name, log=None, tensorboard=False)
            store = result.personal_store
            pooled = registry.personalized_evaluator(task, process)(result.state, store)
            personal = registry.per_client_evaluator(task, process, True)(result.state, store)
            assert sorted(personal) == sorted(f"{c}_accuracy" for c in ids)
            assert np.mean(list(personal.values())) == pytest.approx(
                pooled["personal_mean_client_accuracy"], abs=1e-6)
            if name == "fedavg":
                global_ = registry.per_client_evaluator(task, process, False)(result.state)
                for key, value in personal.items():
                    assert global_[key] == pytest.approx(value, abs=1e-6)


def test_mnist_and_sst2_without_a_data_dir_load_through_tfds():
    """No --data_dir: `mnist` and `sst2` come from TFDS (`mnist`, `glue/sst2`), here its mock
    data (offline, the same code path as a download); `reviews` has no TFDS source and says
    which flag it needs."""
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=40):
        mnist = registry.build_task("mnist", num_clients=4, batch_size=5, local_steps=2, seed=0)
        (x, _), _ = _batches(mnist.client_dataset_fn(mnist.client_ids[0], 1))
        assert x.shape == (5, 784) and mnist.description.startswith("mnist (")
        from models import checkpoints

        try:
            checkpoints.fetch_minilm()   # the WordPiece vocabulary
        except Exception as e:
            pytest.skip(f"all-MiniLM-L6-v2 vocabulary unavailable: {e}")
        sst2 = registry.build_task("sst2", num_clients=2, batch_size=4, local_steps=1, seed=0,
                                   sequence_length=16)
        (x, y), = list(sst2.client_dataset_fn(sst2.client_ids[0], 1))
        assert y.shape == (4,) and set(np.unique(y.numpy())) <= {0, 1}
        assert "padding_mask" in x   # (with the prefix cache, the cached hidden states beside it)
        assert "glue/sst2" in sst2.description or "sst2" in sst2.description
    with pytest.raises(ValueError, match="--data_dir"):
        registry.build_task("reviews", num_clients=5, batch_size=4, local_steps=1, seed=0)
