"""tasks/registry: task names -> tasks whose client data the round loop can rely on."""

import numpy as np
import pytest

from tasks import registry
from tasks.task_config import TaskSpec


def _batches(ds):
    return [(x.numpy(), y.numpy()) for x, y in ds]


def test_client_rounds_take_exactly_local_steps_batches_deterministically():
    task = registry.build_run_task(TaskSpec().with_changes(task="digits", num_clients=5, batch_size=7,
        local_steps=4, seed=3, partition="iid"))
    assert len(task.client_ids) == 5
    cid = task.client_ids[2]
    a = _batches(task.client_dataset_fn(cid, 1))
    b = _batches(task.client_dataset_fn(cid, 1))
    c = _batches(task.client_dataset_fn(cid, 2))
    assert len(a) == 4 and all(x.shape == (7, 64) for x, _ in a)
    assert all(np.array_equal(x1, x2) for (x1, _), (x2, _) in zip(a, b))  # same (seed, round)
    assert not all(np.array_equal(x1, x2) for (x1, _), (x2, _) in zip(a, c))  # next round differs


def test_description_counts_clients_in_the_singular_and_plural():
    one = registry.build_run_task(TaskSpec().with_changes(task="digits", num_clients=1, batch_size=7,
        local_steps=1, seed=0, partition="iid"))
    three = registry.build_run_task(TaskSpec().with_changes(task="digits", num_clients=3, batch_size=7,
        local_steps=1, seed=0, partition="iid"))
    assert ", 1 client;" in one.description and ", 3 clients;" in three.description


def test_shards_partition_gives_k_classes_per_client():
    task = registry.build_run_task(TaskSpec().with_changes(task="digits", num_clients=10,
        batch_size=500, local_steps=1, seed=0, partition="shards", classes_per_client=2))
    for cid in task.client_ids:
        (_, y), = _batches(task.client_dataset_fn(cid, 1))
        assert len(np.unique(y)) == 2


def test_mnist_from_shared_data(shared_data):
    task = registry.build_run_task(TaskSpec().with_changes(task="mnist", num_clients=20, batch_size=8,
        local_steps=2, seed=0, data_dir=shared_data, partition="iid"))
    (x, y), _ = _batches(task.client_dataset_fn(task.client_ids[0], 1))
    assert x.shape == (8, 784) and 0.0 <= x.min() and x.max() <= 1.0
    assert "mnist" in task.description


def test_unknown_names_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        registry.build_run_task(TaskSpec().with_changes(task="nope", num_clients=2, batch_size=1,
            local_steps=1, seed=0, partition="iid"))
    with pytest.raises(ValueError, match="unknown partition 'nope'"):
        registry.build_run_task(TaskSpec().with_changes(task="digits", num_clients=2, batch_size=1,
            local_steps=1, seed=0, partition="nope"))
    with pytest.raises(FileNotFoundError, match="mnist_5k.csv.gz"):
        registry.build_run_task(TaskSpec().with_changes(task="mnist", num_clients=2, batch_size=1,
            local_steps=1, seed=0, data_dir=tmp_path, partition="iid"))


def _minilm_or_skip():
    from models import checkpoints

    try:
        return checkpoints.fetch_minilm()
    except Exception as e:  # no network and no cache
        pytest.skip(f"all-MiniLM-L6-v2 (its vocabulary) is not available: {e}")


@pytest.mark.large
def test_review_domains_are_clients_with_ordered_text_features(sample_data):
    import collections

    _minilm_or_skip()
    task = registry.build_run_task(TaskSpec().with_changes(task="reviews", num_clients=10, batch_size=4,
        local_steps=2, seed=0, data_dir=sample_data, sequence_length=16, prefix_cache=False,
        bucket_by_length=False, partition="iid"))
    assert sorted(task.client_ids) == sorted(
        f"{d}_{j}" for d in ("airline", "books", "dvd", "electronics", "kitchen") for j in (0, 1))
    x, y = next(iter(task.client_dataset_fn(task.client_ids[0], 1)))
    # TFF serializes named elements only as OrderedDicts with sorted keys.
    assert isinstance(x, collections.OrderedDict)
    assert list(x) == ["padding_mask", "segment_ids", "token_ids"]
    assert x["token_ids"].shape == (4, 16) and set(np.unique(y.numpy())) <= {0, 1}
    # The default: the tiny BERT adapts every layer, so only the embeddings are cached, and the
    # clients get h_0 (width 64) in batches cut to their longest example.
    cached = registry.build_run_task(TaskSpec().with_changes(task="reviews", num_clients=10,
        batch_size=4, local_steps=2, seed=0, data_dir=sample_data, sequence_length=16, partition="iid"))
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
        registry.build_run_task(TaskSpec().with_changes(task="reviews", num_clients=7, batch_size=4,
            local_steps=1, seed=0, data_dir=sample_data, partition="iid"))


@pytest.mark.large
def test_sst2_labeled_test_split_is_cut_per_client_like_the_training_labels(sample_data):
    """--eval_test's held-out shards partition SST-2's labeled test split (every sentence in one
    client's shard), and client i gets t_ic of class c's T_c test sentences with
    |t_ic − T_c·n_ic/Σ_j n_jc| < 1 (n_ic: its training sentences of class c), counted from
    the datasets and the TSV files independently of the partition code. On the `sample_data`
    rows (228 test, 674 train sentences): the rule does not depend on the split's size."""
    import csv

    _minilm_or_skip()
    task = registry.build_run_task(TaskSpec().with_changes(task="sst2", num_clients=3, batch_size=512,
        local_steps=1, seed=0, data_dir=sample_data, sequence_length=8, prefix_cache=False,
        bucket_by_length=False, partition="dirichlet", eval_test=True))

    def label_counts(datasets):
        return np.array([np.bincount(np.concatenate([y.numpy() for _, y in d]), minlength=2)
                         for d in datasets])

    ids, train, heldout = task.client_heldout_data()
    assert ids == task.client_eval_data()[0]
    with open(sample_data / "sst2" / "test-labeled.tsv", newline="") as f:
        labels = np.array([int(r["label"]) for r in csv.DictReader(f, delimiter="\t",
                                                                  quoting=csv.QUOTE_NONE)])
    t, n = label_counts(heldout), label_counts(train)
    np.testing.assert_array_equal(t.sum(axis=0), np.bincount(labels, minlength=2))
    assert np.all(np.abs(t - np.bincount(labels) * n / n.sum(axis=0)) < 1)
    assert registry.build_run_task(TaskSpec().with_changes(task="sst2", num_clients=3, batch_size=4,
        local_steps=1, seed=0, data_dir=sample_data, sequence_length=8,
        prefix_cache=False, partition="iid")).client_heldout_data is None


@pytest.mark.large
def test_minilm_pretrained_weights_fit_the_adapted_architecture(sample_data):
    """The frozen weights loaded eagerly from the checkpoint line up, tensor by tensor, with the
    architecture the processes build in their graphs (same order and shapes)."""
    import tensorflow as tf

    from models import hf_bert

    folder = _minilm_or_skip()
    task = registry.build_run_task(TaskSpec().with_changes(task="sst2", num_clients=3, batch_size=4,
        local_steps=1, seed=0, data_dir=sample_data, backbone="minilm", sequence_length=16, rank=2,
        prefix_cache=False, partition="iid"))
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
    cached = registry.build_run_task(TaskSpec().with_changes(task="sst2", num_clients=3, batch_size=4,
        local_steps=1, seed=0, data_dir=sample_data, backbone="minilm", sequence_length=16, rank=2,
        lora_layers=(3, 4, 5), partition="iid"))
    assert "embeddings and layers < 3 cached" in cached.description
    suffix_frozen = cached.pretrained_non_trainable()
    with tf.Graph().as_default():
        model = cached.keras_model_fn()
        assert [tuple(v.shape.as_list()) for v in model.non_trainable_variables] == [
            p.shape for p in suffix_frozen]
    assert not any(p.shape == embeddings.shape for p in suffix_frozen)
    layer_3_query = backbone.transformer_layers[3]._self_attention_layer._query_dense.kernel
    assert any(np.array_equal(p, layer_3_query.numpy()) for p in suffix_frozen)


def test_mnist_and_sst2_without_a_data_dir_load_through_tfds():
    """No --data_dir: `mnist` and `sst2` come from TFDS (`mnist`, `glue/sst2`), here its mock
    data (offline, the same code path as a download); `reviews` has no TFDS source and says
    which flag it needs."""
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=40):
        mnist = registry.build_run_task(TaskSpec().with_changes(task="mnist", num_clients=4,
            batch_size=5, local_steps=2, seed=0, partition="iid"))
        (x, _), _ = _batches(mnist.client_dataset_fn(mnist.client_ids[0], 1))
        assert x.shape == (5, 784) and mnist.description.startswith("mnist (")
        from models import checkpoints

        try:
            checkpoints.fetch_minilm()   # the WordPiece vocabulary
        except Exception as e:
            pytest.skip(f"all-MiniLM-L6-v2 vocabulary unavailable: {e}")
        sst2 = registry.build_run_task(TaskSpec().with_changes(task="sst2", num_clients=2, batch_size=4,
            local_steps=1, seed=0, sequence_length=16, partition="iid"))
        (x, y), = list(sst2.client_dataset_fn(sst2.client_ids[0], 1))
        assert y.shape == (4,) and set(np.unique(y.numpy())) <= {0, 1}
        assert "padding_mask" in x   # (with the prefix cache, the cached hidden states beside it)
        assert "glue/sst2" in sst2.description or "sst2" in sst2.description
    with pytest.raises(ValueError, match="data_dir is needed: task .reviews."):
        registry.build_run_task(TaskSpec().with_changes(task="reviews", num_clients=5, batch_size=4,
            local_steps=1, seed=0, partition="iid"))


@pytest.mark.large
def test_minilm_classifier_pools_by_the_mean_its_checkpoint_declares(sample_data):
    """all-MiniLM-L6-v2 declares mean pooling (its 1_Pooling/config.json), so the SST-2
    classifier's default features are the padding-masked mean of the backbone's last hidden
    state: checked against numpy on a separately loaded backbone, with padded sentences."""
    import tensorflow as tf

    from models import checkpoints
    from models import hf_bert
    from tasks import text as text_lib
    from tasks import text_run_task

    folder = _minilm_or_skip()
    assert checkpoints.declared_pooling(folder) == "mean"
    assert text_run_task.default_pooling("minilm", folder) == "mean"
    assert text_run_task.default_pooling("tiny", folder) == "mean"
    task = registry.build_run_task(TaskSpec().with_changes(task="sst2", num_clients=3, batch_size=4,
        local_steps=1, seed=0, data_dir=sample_data, backbone="minilm", rank=2, prefix_cache=False, partition="iid"))
    assert "mean pooling" in task.description and "whole texts up to 256 tokens" in task.description
    model = task.keras_model_fn()
    for variable, value in zip(model.non_trainable_variables, task.pretrained_non_trainable()):
        variable.assign(value)
    features = tf.keras.Model(model.input, model.get_layer("head").input)
    packer = text_lib.bert_packer(folder / "vocab.txt", 12)
    batch = packer((tf.constant(["a gripping, funny film", "dull", "not bad at all , really"]),))
    backbone, _ = hf_bert.load_hf_bert(folder)
    h = backbone(batch)["sequence_output"].numpy().astype(np.float64)
    m = batch["padding_mask"].numpy().astype(np.float64)[:, :, None]
    assert m.sum() < m.size  # some padding to leave out
    np.testing.assert_allclose(features(batch).numpy(), (h * m).sum(1) / m.sum(1), atol=1e-4)


def test_sst2_default_length_keeps_every_dev_and_test_sentence_whole(shared_data):
    """The SST-2 task's own tokenizer path (`text_run_task._tokenizer`, no `sequence_length`) caps
    texts at the checkpoint's 256 tokens and trims to the longest, so every dev and labeled test
    sentence keeps all its tokens: each row's mask counts its untruncated WordPiece tokens + 2
    ([CLS], [SEP]), counted by the tokenizer alone, and the width is the longest row's."""
    import keras_nlp

    from tasks import text as text_lib
    from tasks import text_files
    from tasks import text_run_task

    folder = _minilm_or_skip()
    _, pooling, cap, packer = text_run_task._tokenizer("minilm", None, None)
    assert (pooling, cap) == ("mean", 256)
    tokenizer = keras_nlp.models.BertTokenizer(vocabulary=str(folder / "vocab.txt"),
                                               lowercase=True)
    splits = text_files.load_glue_tsv(shared_data / "sst2", "sst2", splits=("dev", "test-labeled"))
    longest = {}
    for split, examples in splits.items():
        packed = text_lib.tokenize(examples.segments, packer)
        counts = np.array([len(ids) for ids in tokenizer(list(examples.segments[0])).to_list()])
        np.testing.assert_array_equal(packed["padding_mask"].sum(axis=1), counts + 2)
        assert packed["token_ids"].shape == (len(counts), counts.max() + 2)
        longest[split] = int(counts.max() + 2)
    assert longest == {"dev": 60, "test-labeled": 64}   # docs/RESULTS.md's figures
    assert max(longest.values()) < cap
