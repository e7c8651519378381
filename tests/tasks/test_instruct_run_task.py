"""tasks/instruct_run_task.py: SST-2 and the review domains as instructions for a decoder. The
graph packing (prompts tokenized in tf.data, answers appended per batch) against
`tasks.instructions.pack`; the evaluator against one-prompt-at-a-time generation and likelihood
(`models.causal_lm`) and the response loss; the one-line errors."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from models import causal_lm, decoders
from tasks import batching, instruct_run_task, instructions, registry, text
from tasks.task_config import TaskSpec

BOS = EOS = 256
TEXTS = ["a fine film", "dull", "it is , at best , a mixed bag of moments", "wow"]
LABELS = np.array([1, 0, 0, 1], np.int32)
HELDOUT_TEXTS = ["bad", "a moving , funny and wise film about grief", "good"]


def _bytes_with_bos(s):
    """The packing `instructions.pack` sees: begin of text before a prompt, bytes otherwise."""
    return ([BOS] if s.startswith("Review: ") else []) + list(s.encode("utf-8"))


def _answers():
    return [list(a.encode("utf-8")) + [EOS] for a in instructions.SENTIMENT_ANSWERS]


def _packed_batch(max_prompt=None):
    import keras_nlp

    packer = instruct_run_task.PromptPacker(keras_nlp.tokenizers.ByteTokenizer(lowercase=False), BOS, 0,
                                   max_prompt)
    x = text.tokenize((np.array(TEXTS, object),), packer)
    return instruct_run_task.AnswerAppender(_answers(), 0)(x, LABELS)


def test_answers_appended_in_the_graph_equal_instructions_pack():
    x, y = _packed_batch()
    width = int(x["token_ids"].shape[1])
    expected = instructions.pack(instructions.from_texts(TEXTS, LABELS), _bytes_with_bos,
                                 sequence_length=width, end_id=EOS)
    assert width == max(len(_bytes_with_bos(instructions.SENTIMENT_PROMPT.format(text=t)))
                        + len(_answers()[label]) for t, label in zip(TEXTS, LABELS))
    for key in ("token_ids", "padding_mask", "response_mask"):
        np.testing.assert_array_equal(x[key].numpy(), expected[key], err_msg=key)
    targets = expected["token_ids"][:, 1:][expected["response_mask"][:, 1:] == 1]
    np.testing.assert_array_equal(y.numpy(), targets)


def test_a_width_multiple_pads_the_batch_and_leaves_the_response_loss_unchanged():
    """Cut at ⌈w/m⌉·m (at most max_width): the batch of m = 1 and padding columns, and a causal
    LM's loss on its responses the same."""
    import keras_nlp

    packer = instruct_run_task.PromptPacker(keras_nlp.tokenizers.ByteTokenizer(lowercase=False),
                                            BOS, 0)
    x = text.tokenize((np.array(TEXTS, object),), packer)
    (exact, y), (rounded, y16) = (instruct_run_task.AnswerAppender(_answers(), 0, m)(x, LABELS)
                                  for m in (1, 16))
    w = int(exact["token_ids"].shape[1])
    assert rounded["token_ids"].shape[1] == -(-w // 16) * 16 > w
    for key in ("token_ids", "padding_mask", "response_mask"):
        np.testing.assert_array_equal(rounded[key][:, :w], exact[key], err_msg=key)
        assert not rounded[key][:, w:].numpy().any(), key
    np.testing.assert_array_equal(y16, y)
    capped, _ = instruct_run_task.AnswerAppender(_answers(), 0, 16, max_width=w + 1)(x, LABELS)
    assert capped["token_ids"].shape[1] == w + 1
    decoder = decoders.build_decoder("gpt2_tiny")
    lm = causal_lm.build_causal_lm(decoder.backbone_fn())
    loss = [tf.keras.losses.sparse_categorical_crossentropy(y, lm(batch), from_logits=True)
            for batch in (exact, rounded)]
    np.testing.assert_allclose(loss[1], loss[0], rtol=1e-5, atol=1e-6)


def test_a_cut_prompt_keeps_its_end_and_its_whole_answer():
    x, _ = _packed_batch(max_prompt=12)
    for row, label, txt in zip(range(len(TEXTS)), LABELS, TEXTS):
        prompt = _bytes_with_bos(instructions.SENTIMENT_PROMPT.format(text=txt))[-12:]
        n = len(prompt) + len(_answers()[label])
        np.testing.assert_array_equal(x["token_ids"][row, :n], prompt + _answers()[label])
        assert x["response_mask"][row].numpy().sum() == len(_answers()[label])


@pytest.fixture(scope="module")
def sst2_folder(tmp_path_factory):
    """A GLUE-layout SST-2 folder of a few sentences (train 12, dev 5, labeled test 3)."""
    root = tmp_path_factory.mktemp("instruct_data")
    (root / "sst2").mkdir()
    train = [(f"sentence {i} " + "good " * (i % 3), i % 2) for i in range(12)]
    dev = [("a fine film", 1), ("dull", 0), ("so bad", 0), ("great fun", 1), ("meh", 0)]
    test = [("bad", 0), ("a moving film", 1), ("good", 1)]
    for split, rows in (("train", train), ("dev", dev), ("test-labeled", test)):
        lines = ["sentence\tlabel"] + [f"{s}\t{y}" for s, y in rows]
        (root / "sst2" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def _task(folder, **kwargs):
    args = dict(num_clients=3, batch_size=4, local_steps=2, seed=0, data_dir=folder, partition="iid",
                backbone="gpt2_tiny", rank=2)
    return registry.build_run_task(TaskSpec().with_changes(task="sst2_instruct", **{**args, **kwargs}))


def test_round_batches_hold_prompts_answers_and_the_answer_tokens_as_labels(sst2_folder):
    task = _task(sst2_folder)
    assert task.client_ids == ["client_000", "client_001", "client_002"]
    batches = list(task.client_dataset_fn("client_000", 1))
    assert len(batches) == 2
    answer_sets = {tuple(a) for a in _answers()}
    for x, y in batches:
        rows = x["response_mask"].numpy().astype(bool)
        width, m = x["token_ids"].shape[1], batching.WIDTH_MULTIPLE
        longest = x["padding_mask"].numpy().sum(axis=1).max()
        assert width % m == 0 and width - m < longest <= width   # its longest row, rounded up
        answers = [tuple(t[m]) for t, m in zip(x["token_ids"].numpy(), rows)]
        assert set(answers) <= answer_sets
        np.testing.assert_array_equal(y.numpy(), np.concatenate(answers))
    assert "gpt2_tiny" not in task.description and "GPT-2 over bytes" in task.description
    assert task.decoder.name == "gpt2_tiny" and task.decoder.bos_id == BOS   # for generation


@pytest.mark.large
def test_the_evaluator_equals_one_prompt_at_a_time_generation_likelihood_and_loss(sst2_folder):
    """On the dev split and, with eval_test, on SST-2's labeled test split (its measures named
    test_<measure>), by the same model."""
    task = _task(sst2_folder, eval_test=True)
    model = task.keras_model_fn()
    weights = tff.learning.models.ModelWeights.from_model(model)
    got = task.evaluate(weights)
    names = ("loss", "token_accuracy", "accuracy", "unparseable", "likelihood_accuracy")
    assert set(got) == set(names) | {f"test_{n}" for n in names}
    decoder = decoders.build_decoder("gpt2_tiny")
    backbone = decoder.backbone_fn()
    from models import lora_targets
    lora_targets.apply_lora(backbone, lora_targets.LoraConfig(rank=2, seed=0))
    lm = causal_lm.build_causal_lm(backbone)
    weights.assign_weights_to(lm)
    dev = [("a fine film", 1), ("dull", 0), ("so bad", 0), ("great fun", 1), ("meh", 0)]
    test = [("bad", 0), ("a moving film", 1), ("good", 1)]
    for prefix, rows in (("", dev), ("test_", test)):
        generated, chosen = [], []
        for sentence, _ in rows:
            prompt = _bytes_with_bos(instructions.SENTIMENT_PROMPT.format(text=sentence))
            ids = causal_lm.greedy_generate(backbone, prompt, 9, stop_ids=[EOS])
            generated.append(bytes(i for i in ids if i < 256).decode("utf-8", "replace"))
            chosen.append(causal_lm.choose_by_likelihood(
                backbone, prompt, [a[:-1] for a in _answers()]))
        labels = [y for _, y in rows]
        expected = instructions.exact_match_accuracy(generated, labels)
        assert got[prefix + "accuracy"] == expected["accuracy"]
        assert got[prefix + "unparseable"] == expected["unparseable"]
        assert got[prefix + "likelihood_accuracy"] == np.mean(np.array(chosen) == labels)
        packed = instructions.pack(instructions.from_texts([s for s, _ in rows], labels),
                                   _bytes_with_bos, 64, end_id=EOS)
        logits, targets = causal_lm.response_logits(backbone, packed)
        losses = tf.keras.losses.sparse_categorical_crossentropy(targets, logits,
                                                                 from_logits=True)
        np.testing.assert_allclose(got[prefix + "loss"], float(tf.reduce_mean(losses)),
                                   rtol=1e-5)
        correct = tf.reduce_mean(tf.cast(
            tf.argmax(logits, -1, output_type=tf.int32) == targets, tf.float32))
        np.testing.assert_allclose(got[prefix + "token_accuracy"], float(correct), rtol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    ({"backbone": "tiny"}, "backbone=tiny: task 'sst2_instruct' trains a decoder"),
    ({"eval_test": True, "data_dir": None},
     "eval_test=True: TFDS's SST-2 test split is unlabelled; pass data_dir="),
    ({"lora_targets": ("query", "ffn_gate")},
     "lora_targets=query,ffn_gate: gpt2_tiny's decoder layers have no 'ffn_gate' projection"),
    ({"lora_layers": (0, 2)},
     "lora_layers=0,2: gpt2_tiny has 2 decoder layers, 0 to 1; layer 2 is not one of them"),
    ({"sequence_length": 9}, "sequence_length=9: the answers take up to 10 tokens"),
    ({"sequence_length": 4096}, "sequence_length=4096: gpt2_tiny has 1024 positions"),
    ({"partition": "stripes"}, "unknown partition 'stripes'"),
])
def test_bad_values_are_one_line_errors(sst2_folder, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as error:
        _task(sst2_folder, **kwargs)
    assert "\n" not in str(error.value)


def test_the_review_domains_have_no_test_split_beside_the_evaluated_one(sample_data):
    with pytest.raises(ValueError, match="eval_test=True: task 'reviews_instruct' evaluates "
                                         "one split"):
        registry.build_run_task(TaskSpec().with_changes(
            task="reviews_instruct", num_clients=5, batch_size=4, local_steps=1, seed=0,
            data_dir=sample_data, backbone="gpt2_tiny", partition="iid", eval_test=True))


def test_the_review_domains_need_their_folder():
    with pytest.raises(ValueError, match="data_dir is needed: task 'reviews_instruct'"):
        registry.build_run_task(TaskSpec().with_changes(task="reviews_instruct", num_clients=5,
            batch_size=4, local_steps=1, seed=0, backbone="gpt2_tiny", partition="iid"))


def test_the_decoders_lora_targets_are_their_layers_own():
    from models import lora_targets

    decoder = decoders.build_decoder("gpt2_tiny")
    layer = decoder.backbone_fn().transformer_layers[0]
    assert decoder.lora_targets == tuple(lora_targets.layer_targets(layer))
    assert collections.Counter(decoder.tokenize(["ab", ""])[0]) == {97: 1, 98: 1}


def test_the_review_domains_are_natural_clients_of_the_instruction_task(sample_data):
    """Reviews longer than the decoder's 1,024 positions lose their start, not their answer."""
    task = registry.build_run_task(TaskSpec().with_changes(task="reviews_instruct", num_clients=5,
        batch_size=4, local_steps=1, seed=0, data_dir=sample_data, backbone="gpt2_tiny", rank=2, partition="iid"))
    assert "L=up to 1024 tokens" in task.description
    assert task.client_ids == ["airline", "books", "dvd", "electronics", "kitchen"]
    ((x, y),) = list(task.client_dataset_fn("books", 1))
    assert x["response_mask"].numpy().sum() == len(y.numpy()) > 0


def test_the_prompt_style_of_each_instruction_task(tmp_path):
    from tasks.task_config import TaskConfig

    (tmp_path / "alpaca.json").write_text('[{"instruction": "x", "output": "y"}]')
    (tmp_path / "chat.jsonl").write_text('{"prompt": "x", "response": "y"}\n')
    assert instruct_run_task.prompt_style(TaskConfig(task="sst2_instruct")) == "sentiment"
    assert instruct_run_task.prompt_style(TaskConfig(task="reviews_instruct")) == "sentiment"
    assert instruct_run_task.prompt_style(TaskConfig(task="instruct",
                                            train_file=str(tmp_path / "alpaca.json"))) == "alpaca"
    assert instruct_run_task.prompt_style(TaskConfig(task="instruct",
                                            train_file=str(tmp_path / "chat.jsonl"))) == (
        "as_written")
    with pytest.raises(ValueError, match="task=sst2: not an instruction task"):
        instruct_run_task.prompt_style(TaskConfig(task="sst2"))


TINY_GEMMA = {"vocabulary_size": 300, "num_layers": 3, "num_query_heads": 2,
              "num_key_value_heads": 1, "hidden_dim": 16, "intermediate_dim": 32, "head_dim": 8,
              "sliding_window": 4, "global_layer_every": 2}


def _expected_one_token_measures(backbone, decoder, answers, texts=TEXTS, labels=LABELS):
    """The evaluator's measures on `texts`, one prompt at a time: greedy generation, likelihood
    choice, and the answer tokens' loss and accuracy in float64 numpy."""
    generated, chosen, log_p, correct = [], [], [], []
    for sentence, label in zip(texts, labels):
        prompt = _bytes_with_bos(instructions.SENTIMENT_PROMPT.format(text=sentence))
        ids = causal_lm.greedy_generate(backbone, prompt, 1, stop_ids=[EOS])
        generated.append(decoder.detokenize(ids))
        chosen.append(causal_lm.choose_by_likelihood(backbone, prompt, [a[:1] for a in answers]))
        row = np.array([prompt + answers[label]], np.int32)
        hidden = backbone({"token_ids": row, "padding_mask": np.ones_like(row)})
        logits = backbone.token_embedding(hidden[0], reverse=True).numpy().astype(np.float64)
        for position in (len(prompt) - 1, len(prompt)):
            z = logits[position]
            target = row[0, position + 1]
            log_p.append(z[target] - z.max() - np.log(np.exp(z - z.max()).sum()))
            correct.append(np.argmax(z) == target)
    matched = instructions.exact_match_accuracy(generated, labels)
    return {"accuracy": matched["accuracy"], "unparseable": matched["unparseable"],
            "likelihood_accuracy": np.mean(np.array(chosen) == labels),
            "loss": -np.mean(log_p), "token_accuracy": np.mean(correct)}


@pytest.mark.large
@pytest.mark.parametrize("architecture", ["gpt2_tiny", "tiny_gemma3"])
def test_one_token_answers_are_evaluated_in_one_pass_as_generation_likelihood_and_loss_define(
        architecture, tmp_path):
    """Answers of one token and end of text (Gemma 3's " negative", " positive"; here the bytes
    'n' and 'p'): every measure from one forward pass per batch, against one prompt at a time.
    On Gemma 3 (LoRA on its last layer only) the frozen layers' outputs are kept from the first
    call; other frozen weights recompute them, the same weights reuse them. A held-out split
    beside the evaluated one gets the same measures on its own rows, named test_<measure>.
    The base by reference (`tffl.engine.frozen.FrozenValue`s of its file) gives the same."""
    import dataclasses
    import types

    import keras_nlp

    from models import lora_targets
    from models.gemma3_backbone import Gemma3Backbone, Gemma3BackboneConfig

    decoder = decoders.build_decoder("gpt2_tiny")
    lora = lora_targets.LoraConfig(rank=2, seed=0)
    if architecture == "tiny_gemma3":
        decoder = dataclasses.replace(
            decoder, backbone_fn=lambda: Gemma3Backbone(Gemma3BackboneConfig(**TINY_GEMMA)))
        lora = lora_targets.LoraConfig(rank=2, layers=(2,), seed=0)
    answers = [[ord("n"), EOS], [ord("p"), EOS]]

    def lm_fn():
        backbone = decoder.backbone_fn()
        lora_targets.apply_lora(backbone, lora)
        return backbone, causal_lm.build_causal_lm(backbone)

    packer = instruct_run_task.PromptPacker(keras_nlp.tokenizers.ByteTokenizer(lowercase=False),
                                            BOS, 0)
    x = text.tokenize((np.array(TEXTS, object),), packer)
    dev = types.SimpleNamespace(
        global_test_data=tf.data.Dataset.from_tensor_slices((dict(x), LABELS)))
    test_texts, test_labels = HELDOUT_TEXTS, np.array([0, 1, 1], np.int32)
    heldout = tf.data.Dataset.from_tensor_slices((
        dict(text.tokenize((np.array(test_texts, object),), packer)), test_labels))
    backbone, lm = lm_fn()
    for variable in lm.trainable_variables:   # LoRA factors away from their zero start
        variable.assign(tf.random.stateless_normal(variable.shape, [1, 2], stddev=0.5))
    evaluate = instruct_run_task.make_evaluator(lm_fn, dev, decoder, answers, batch_size=3,
                                                heldout=heldout)
    from tffl.engine import frozen

    for step in ("same", "changed", "same", "by_reference", "by_reference", "same"):
        if step == "changed":   # another frozen base: the kept outputs are stale
            embedding = backbone.token_embedding.embeddings
            embedding.assign(embedding * 1.5 + 0.01)
        weights = tff.learning.models.ModelWeights.from_model(lm)
        if step == "by_reference":
            base = frozen.FrozenWeights.write([np.asarray(v) for v in weights.non_trainable],
                                              tmp_path)
            weights = tff.learning.models.ModelWeights(
                [np.asarray(v) for v in weights.trainable], base.values())
        got = evaluate(weights)
        for prefix, expected in (
                ("", _expected_one_token_measures(backbone, decoder, answers)),
                ("test_", _expected_one_token_measures(backbone, decoder, answers, test_texts,
                                                       test_labels))):
            for name in ("accuracy", "unparseable", "likelihood_accuracy", "token_accuracy"):
                assert got[prefix + name] == expected[name], prefix + name
            np.testing.assert_allclose(got[prefix + "loss"], expected["loss"], rtol=1e-5)


def test_an_empty_evaluated_split_is_one_line():
    import types

    empty = types.SimpleNamespace(global_test_data=tf.data.Dataset.from_tensor_slices((
        {"token_ids": np.zeros([0, 4], np.int32), "padding_mask": np.zeros([0, 4], np.int32)},
        np.zeros([0], np.int32))))
    decoder = decoders.build_decoder("gpt2_tiny")
    evaluate = instruct_run_task.make_evaluator(lambda: (None, None), empty, decoder,
                                                [[ord("n"), EOS], [ord("p"), EOS]])
    with pytest.raises(ValueError, match="the evaluation dataset has no examples"):
        evaluate(None)


@pytest.mark.parametrize("base_dtype", ["float32", "bfloat16", "int8"])
def test_the_checkpoints_frozen_values_without_an_eager_model_are_the_loaded_ones(
        tmp_path, base_dtype):
    # A decoder with `pretrained_values` reads the frozen weights in a graph-built model's
    # order; they equal the loaded backbone's (`pretrained_fn`) with LoRA on, value for value.
    import dataclasses

    from models import gguf_checkpoint, lora_targets
    from models.gemma3_backbone import Gemma3Backbone, Gemma3BackboneConfig
    from tests.models.gemma3_reference import random_gguf_tensors

    tiny = {"vocabulary_size": 64, "num_layers": 2, "num_query_heads": 2,
            "num_key_value_heads": 1, "hidden_dim": 16, "intermediate_dim": 32, "head_dim": 8,
            "sliding_window": 2, "global_layer_every": 2, "layer_norm_epsilon": 1e-6,
            "global_rope_base": 1e6, "local_rope_base": 1e4}
    config = Gemma3BackboneConfig(**tiny)
    tensors, _ = random_gguf_tensors(tiny, quantize=False)

    def backbone_fn():
        return Gemma3Backbone(config, initializer="zeros", base_dtype=base_dtype)

    def pretrained_fn():
        backbone = backbone_fn()
        gguf_checkpoint.assign_gguf_weights(backbone, tensors)
        return backbone

    eager = decoders.Decoder(
        "gemma3_270m", "tiny Gemma 3", backbone_fn, pretrained_fn, tokenize=None,
        detokenize=None, tokenizer=None, bos_id=2, eos_id=1, pad_id=0, max_length=64,
        lora_targets=("query", "value"), num_layers=2)
    graph = dataclasses.replace(
        eager, pretrained_values=lambda backbone: gguf_checkpoint.gguf_values(backbone, tensors))
    lora = lora_targets.LoraConfig(rank=2, targets=("query", "value"), layers=(1,))
    values = [instruct_run_task._starting_non_trainable(
        instruct_run_task._lm_builder(d, lora), d, lora, None, tmp_path / name)()
        for d, name in ((eager, "eager"), (graph, "graph"))]
    scales = 1 + 2 * 7 if base_dtype == "int8" else 0     # int8: a scale per kernel
    assert len(values[0]) == len(values[1]) == 2 * 13 + 2 + scales   # norms, kernels; no LoRA
    for loaded, read in zip(*values):
        assert read.dtype == loaded.dtype
        np.testing.assert_array_equal(read, loaded)
