"""The user's own data as tasks (tasks/text_run_task.py's `text`, tasks/instruct_run_task.py's
`instruct`, tasks/tfds_text.py): files written here, cut into clients and tokenized, checked
against the rows of the files and an independent tokenization of their texts."""

import json

import numpy as np
import pytest

from tasks import text as text_lib
from tasks import text_run_task
from tasks.task_config import TaskSpec

_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "bad", "film", "plot",
          "not", "so", "the", "is", "it", "was"]
_USERS = ("ann", "bob", "cy")


def _packer(length=12):
    return text_lib.bert_packer(_VOCAB, length)


def _write_reviews(folder, n=30, seed=0, users=_USERS, header=("review", "stars", "user")):
    rng = np.random.default_rng(seed)
    words = _VOCAB[5:]
    rows = [(" ".join(rng.choice(words, size=rng.integers(2, 6))), str(rng.integers(1, 4)),
             str(rng.choice(users))) for _ in range(n)]
    (folder).write_text(",".join(header) + "\n" + "".join(",".join(r) + "\n" for r in rows))
    return rows


def _spec(**changes):
    return TaskSpec().with_changes(task="text", text_column="review", label_column="stars",
                                   client_column="user", **changes)


def _examples(client_data, cid):
    x, y = zip(*client_data.create_tf_dataset_for_client(cid).as_numpy_iterator())
    return np.stack([e["token_ids"] for e in x]), np.array(y)


def test_a_client_column_makes_one_client_per_value_holding_its_rows(tmp_path):
    train = _write_reviews(tmp_path / "train.csv", seed=0)
    dev = _write_reviews(tmp_path / "dev.csv", n=12, seed=1)
    data = text_run_task.load_text_task(_spec(train_file=str(tmp_path / "train.csv"),
                                              dev_file=str(tmp_path / "dev.csv")), _packer())
    task = data.task
    assert data.label_names == ("1", "2", "3") and task.num_classes == 3
    assert sorted(task.train_data.client_ids) == sorted({u for *_, u in train})
    packer = _packer()
    for split, rows, client_data in (("train", train, task.train_data),
                                     ("dev", dev, task.test_data)):
        for cid in client_data.client_ids:
            mine = [r for r in rows if r[2] == cid]
            ids, labels = _examples(client_data, cid)
            expected = text_lib.tokenize((np.array([r[0] for r in mine], dtype=object),),
                                         packer)["token_ids"]
            # The same texts in the same order, and each label its index in "1" < "2" < "3".
            np.testing.assert_array_equal(ids, expected, err_msg=f"{split} {cid}")
            np.testing.assert_array_equal(labels, [int(r[1]) - 1 for r in mine])
    assert data.eval_split == "dev"


def test_without_a_dev_file_a_tenth_is_held_out_stratified_and_kept_with_its_client(tmp_path):
    train = _write_reviews(tmp_path / "train.csv", n=60, seed=2)
    data = text_run_task.load_text_task(_spec(train_file=str(tmp_path / "train.csv")),
                                        _packer())
    held = sum(len(list(data.task.test_data.create_tf_dataset_for_client(c)))
               for c in data.task.test_data.client_ids)
    kept = sum(data.task.info["train_sizes"].values())
    labels = np.array([int(r[1]) for r in train])
    # holdout_split: round(0.1 · n_c) of each label c.
    assert held == sum(round(0.1 * np.sum(labels == c)) for c in np.unique(labels))
    assert kept + held == len(train)


def test_a_dev_file_without_the_client_column_follows_the_clients_label_shares(tmp_path):
    _write_reviews(tmp_path / "train.csv", n=60, seed=3)
    _write_reviews(tmp_path / "dev.csv", n=30, seed=4, header=("review", "stars", "other"))
    data = text_run_task.load_text_task(_spec(train_file=str(tmp_path / "train.csv"),
                                              dev_file=str(tmp_path / "dev.csv")), _packer())
    sizes = data.task.info["test_sizes"]
    assert sum(sizes.values()) == 30 and set(sizes) == set(data.task.train_data.client_ids)


def test_without_a_client_column_the_rows_are_partitioned(tmp_path):
    train = _write_reviews(tmp_path / "train.csv", n=40, seed=5)
    spec = _spec(train_file=str(tmp_path / "train.csv")).with_changes(
        client_column=None, partition="iid", num_clients=4)
    data = text_run_task.load_text_task(spec, _packer())
    assert len(data.task.train_data.client_ids) == 4
    labels = np.array([int(r[1]) for r in train])
    held = sum(round(0.1 * np.sum(labels == c)) for c in np.unique(labels))
    assert sum(data.task.info["train_sizes"].values()) == 40 - held


def test_sentence_pairs_are_packed_as_cls_text_sep_pair_sep(tmp_path):
    (tmp_path / "pairs.tsv").write_text(
        "premise\thypothesis\tlabel\tuser\n"
        "the film is good\tit was bad\tcontradiction\tann\n"
        "the plot\tthe plot is good\tneutral\tann\n"
        "a good film\ta film\tentailment\tbob\n"
        "so bad\tnot good\tentailment\tbob\n")
    spec = TaskSpec().with_changes(task="text", train_file=str(tmp_path / "pairs.tsv"),
                                   dev_file=str(tmp_path / "pairs.tsv"), text_column="premise",
                                   text_pair_column="hypothesis", client_column="user")
    task = text_run_task.load_text_task(spec, _packer(16)).task
    x, y = zip(*task.train_data.create_tf_dataset_for_client("ann").as_numpy_iterator())
    ids = {w: i for i, w in enumerate(_VOCAB)}
    first = [ids[t] for t in "[CLS] the film is good [SEP] it was bad [SEP]".split()]
    np.testing.assert_array_equal(x[0]["token_ids"][:len(first)], first)
    np.testing.assert_array_equal(x[0]["segment_ids"][:len(first)],
                                  [0] * 6 + [1] * 4)  # [CLS] a [SEP] is segment 0
    assert list(y) == [0, 2]   # contradiction < entailment < neutral


def test_a_tfds_dataset_by_name_with_mock_data(tfds):
    with tfds.testing.mock_data(num_examples=12):
        spec = TaskSpec().with_changes(task="text", tfds_name="imdb_reviews",
                                       tfds_splits=("train", "test"), partition="iid",
                                       num_clients=3)
        data = text_run_task.load_text_task(spec, _packer())
    assert data.label_names == ("neg", "pos") or set(data.label_names) <= {"neg", "pos"}
    assert sum(data.task.info["train_sizes"].values()) == 12
    assert data.eval_split == "test" and len(data.task.train_data.client_ids) == 3


@pytest.mark.parametrize("rows, message", [
    ("review,stars,user\ngood film,1,ann\nbad,2,\n",
     r"train.csv: line 3, column 'user': empty client"),
    ("text,stars,user\ngood film,1,ann\n",
     r"train.csv: no column 'review' \(its columns: text, stars, user\); name the text column "
     r"with text_column=<one of them>"),
])
def test_bad_rows_are_one_line_naming_the_file(tmp_path, rows, message):
    (tmp_path / "train.csv").write_text(rows)
    with pytest.raises(ValueError, match=message):
        text_run_task.load_text_task(_spec(train_file=str(tmp_path / "train.csv")), _packer())


def test_a_dev_label_or_client_training_never_saw_is_named_with_its_line(tmp_path):
    (tmp_path / "train.csv").write_text("review,stars,user\ngood,1,ann\nbad,2,bob\nfilm,1,ann\n")
    (tmp_path / "dev.csv").write_text("review,stars,user\ngood,1,ann\nbad,5,bob\n")
    spec = _spec(train_file=str(tmp_path / "train.csv"), dev_file=str(tmp_path / "dev.csv"))
    with pytest.raises(ValueError, match=r"dev.csv: line 3, column 'stars': label '5' does not "
                                         r"occur in the training rows \(their labels: 1, 2\)"):
        text_run_task.load_text_task(spec, _packer())
    (tmp_path / "dev.csv").write_text("review,stars,user\ngood,1,dee\n")
    with pytest.raises(ValueError, match=r"dev.csv: line 2, column 'user': client 'dee' has no "
                                         r"training rows in"):
        text_run_task.load_text_task(spec, _packer())


def test_the_users_instructions_are_packed_prompt_then_response_then_end(tmp_path):
    """`instruct`: each row is begin of text, the prompt's bytes, the response's and end of
    text (gpt2_tiny's byte tokenizer: ids are the UTF-8 bytes, 256 begins and ends), the
    response mask on the response and its end, the clients from the client column."""
    from tasks import registry

    rows = [{"prompt": "Q: 2+2?", "response": " 4", "user": "ann"},
            {"prompt": "Q: capital of France?", "response": " Paris", "user": "bob"},
            {"prompt": "Q: 3+3?", "response": " 6", "user": "ann"}]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "dev.jsonl").write_text(json.dumps(rows[1]) + "\n")
    spec = TaskSpec().with_changes(task="instruct", backbone="gpt2_tiny", rank=2,
                                   train_file=str(tmp_path / "train.jsonl"),
                                   dev_file=str(tmp_path / "dev.jsonl"), client_column="user",
                                   local_steps=1, batch_size=2)
    task = registry.build_run_task(spec)
    assert task.client_ids == ["ann", "bob"] and task.random_backbone
    ((x, y),) = list(task.client_dataset_fn("ann", 1))
    expected = {r["prompt"]: (1 + len(r["prompt"].encode()),
                              [256, *r["prompt"].encode(), *r["response"].encode(), 256])
                for r in rows if r["user"] == "ann"}
    targets = []
    for row, padding, mask in zip(x["token_ids"].numpy(), x["padding_mask"].numpy(),
                                  x["response_mask"].numpy()):
        start, tokens = next(v for v in expected.values()
                             if list(row[:int(padding.sum())]) == v[1])
        assert list(np.flatnonzero(mask)) == list(range(start, len(tokens)))
        targets += tokens[start:]
    assert len(x["token_ids"]) == 2   # both of ann's rows, each matched once above
    # y: the response tokens the model predicts (`with_response_targets`), in row order.
    assert y.numpy().tolist() == targets
    assert task.eval_split == "dev"


def test_the_starting_frozen_weights_go_to_the_runs_frozen_dir(tmp_path, monkeypatch):
    """The starting values' file (`tasks.run_task.starting_non_trainable`) is written under the
    run's `frozen_dir`, where its LoRA process writes the base, not under the default folder."""
    from tasks import registry

    monkeypatch.setenv("TFFL_FROZEN_DIR", str(tmp_path / "default"))
    _write_reviews(tmp_path / "train.csv")
    task = registry.build_run_task(_spec(train_file=str(tmp_path / "train.csv"),
                                         frozen_dir=str(tmp_path / "mine")))
    task.pretrained_non_trainable()   # the suffix's values, read from the starting ones
    written = [p.parent.parent.name for p in tmp_path.rglob("weights.index")]
    assert written == ["mine"]
