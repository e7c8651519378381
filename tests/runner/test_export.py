"""runner/export.py (and scripts/export_adapters.py, its command line): a run folder -> a PEFT
adapter folder (+ the tiny run's HF base) that rebuilds the trained classifier exactly (its dev
loss is the run's recorded eval_loss)."""

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from runner import export
from scripts import export_adapters
from tests import forked_python

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _script(name, *args):
    return forked_python.run_script(ROOT / "scripts" / name, *args, timeout=900)


# A tiny SST-2 run (the tiny BERT, one round of two clients) on `sample_data`: the tests check
# that its export rebuilds it exactly, not what it learned, so a sample of real sentences does.
_TINY_SST2 = ["--task=sst2", "--backbone=tiny", "--algorithm=fedavg", "--rounds=1",
              "--num_clients=2", "--clients_per_round=2", "--local_steps=1", "--batch_size=4",
              "--sequence_length=16"]


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory, sample_data):
    """(run folder, adapter folder, vocabulary) of one tiny SST-2 train.py run (in this process)
    exported by scripts/export_adapters.py (a child), shared by this module's large tests."""
    from models import checkpoints
    from scripts import train

    try:
        vocab = checkpoints.fetch_minilm() / "vocab.txt"
    except Exception as e:
        pytest.skip(f"all-MiniLM-L6-v2 vocabulary unavailable: {e}")
    root = tmp_path_factory.mktemp("exported_run")
    run, out = root / "run", root / "adapters"
    assert train.run_command_line(["train.py", *_TINY_SST2, f"--data_dir={sample_data}",
                                   f"--output_dir={run}"]) == 0
    proc = _script("export_adapters.py", f"--run_dir={run}", f"--output_dir={out}",
                   f"--data_dir={sample_data}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run, out, vocab


@pytest.mark.large
def test_export_of_a_tiny_sst2_run_rebuilds_its_classifier(exported_run, sample_data):
    from models import backbones, hf_bert, peft_export
    from models.lora_targets import LoraConfig, apply_lora
    from tasks import text as text_lib

    run, out, vocab = exported_run
    config = json.loads((out / "adapter_config.json").read_text())
    head = json.loads((out / "tffl_head.json").read_text())
    assert config["base_model_name_or_path"] == str((out / "base").resolve())
    assert (out / "base" / "vocab.txt").is_file()
    assert config["task_type"] == head["task_type"] == "FEATURE_EXTRACTION"  # mean pooling

    backbone, _ = hf_bert.load_hf_bert(out / "base")
    apply_lora(backbone, LoraConfig(rank=config["r"], alpha=config["lora_alpha"],
                                    targets=("query", "value")))
    model = backbones.build_classifier(backbone, head["num_labels"], pooling=head["pooling"],
                                       head=head["head"])
    peft_export.import_peft(model, out)
    lines = (sample_data / "sst2" / "dev.tsv").read_text().splitlines()[1:]
    texts = [line.rsplit("\t", 1)[0] for line in lines]
    labels = np.array([int(line.rsplit("\t", 1)[1]) for line in lines])
    logits = model(text_lib.bert_packer(vocab, 16)(tf.constant(texts))).numpy()
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
    summary = json.loads((run / "summary.json").read_text())
    assert float(loss) == pytest.approx(summary["final"]["eval_loss"], rel=1e-5, abs=1e-6)
    # docs/models.md's recipe over the exported files alone (numpy: tests/models/
    # bert_reference.py) computes the same logits, on the base/ the export assembled.
    from tests.models.bert_reference import recipe_logits

    x = text_lib.bert_packer(vocab, 16)(tf.constant(texts))
    recipe = recipe_logits(out, out / "base", x["token_ids"].numpy(), x["padding_mask"].numpy())
    np.testing.assert_allclose(recipe, logits, atol=1e-5, rtol=0)


@pytest.mark.large
def test_a_run_started_from_exported_adapters_starts_where_the_exported_run_ended(
        exported_run, sample_data, tmp_path, capsys):
    """train.py --init_adapters=<export>: a round at a negligible learning rate evaluates as the
    exported run's last round did (its dev loss to 1e-5): the adapters and the head arrived."""
    from scripts import train

    run, out, _ = exported_run
    again = tmp_path / "again"
    capsys.readouterr()
    assert train.run_command_line(["train.py", *_TINY_SST2, f"--data_dir={sample_data}",
                                   "--learning_rate=1e-12", f"--init_adapters={out}",
                                   f"--output_dir={again}"]) == 0
    assert "starting from" in capsys.readouterr().out
    exported = json.loads((run / "summary.json").read_text())["final"]["eval_loss"]
    started = json.loads((again / "summary.json").read_text())
    assert started["flags"]["init_adapters"] == str(out)
    assert started["final"]["eval_loss"] == pytest.approx(exported, rel=1e-5)


def test_init_adapters_is_refused_for_image_tasks_and_folders_without_adapters(tmp_path, capsys):
    from scripts import train

    assert train.run_command_line(["train.py", f"--init_adapters={tmp_path}",
                                   f"--output_dir={tmp_path / 'r'}"]) == 2
    assert "PEFT adapters are for the text tasks" in capsys.readouterr().err
    assert train.run_command_line(["train.py", "--task=sst2_instruct", "--backbone=gpt2_tiny",
                                   f"--init_adapters={tmp_path}",
                                   f"--output_dir={tmp_path / 'r'}"]) == 2
    assert "--backbone=gpt2_tiny has no Hugging Face counterpart" in capsys.readouterr().err
    assert train.run_command_line(["train.py", "--task=sst2", f"--init_adapters={tmp_path}",
                                   f"--output_dir={tmp_path / 'r'}"]) == 2
    assert f"flag --init_adapters={tmp_path}: no adapter_config.json there" in (
        capsys.readouterr().err)


def test_runs_without_a_hugging_face_counterpart_are_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"backbone 'gpt2_tiny' has no Hugging Face counterpart"
                                         r".* covers the decoders gemma3_270m$"):
        export.check_exportable(tmp_path, {"task": "sst2_instruct", "backbone": "gpt2_tiny"})
    with pytest.raises(ValueError, match="task 'mnist' has no LoRA backbone"):
        export.check_exportable(tmp_path, {"task": "mnist", "backbone": None})
    export.check_exportable(tmp_path, {"task": "reviews_instruct", "backbone": "gemma3_270m"})


def test_a_gemma3_run_exports_causal_lm_adapters_of_the_hub_model(tmp_path, monkeypatch):
    """The decoder path of export_run (the trained model stubbed by a tiny Gemma 3 LM; the
    adapters' values are checked against numpy in tests/models/test_peft_decoder.py)."""
    import types

    from models import causal_lm
    from models.gemma3_backbone import Gemma3Backbone, Gemma3BackboneConfig
    from models.lora_targets import LoraConfig, apply_lora

    backbone = Gemma3Backbone(Gemma3BackboneConfig(
        vocabulary_size=32, num_layers=2, num_query_heads=2, num_key_value_heads=1, hidden_dim=8,
        intermediate_dim=16, head_dim=4, sliding_window=3, global_layer_every=2))
    apply_lora(backbone, LoraConfig(rank=2, targets=("query", "value"), layers=(1,)))
    model = causal_lm.build_causal_lm(backbone)
    meta = {"round": 7, "config": {"task": "sst2_instruct", "backbone": "gemma3_270m"}}
    run = types.SimpleNamespace(model=types.SimpleNamespace(backbone="gemma3_270m"))
    monkeypatch.setattr(export, "trained_model",
                        lambda *args: (model, meta, run, None))
    record = export.export_run(tmp_path / "run", tmp_path / "out")
    config = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert (config["base_model_name_or_path"], config["task_type"]) == (
        "google/gemma-3-270m", "CAUSAL_LM")
    assert config["target_modules"] == (
        r"(?:.*\.)?(?:model\.layers\.1\.self_attn\.q_proj|model\.layers\.1\.self_attn\.v_proj)")
    assert record["base_exported"] is False and not (tmp_path / "out" / "base").exists()
    assert json.loads((tmp_path / "out" / "export.json").read_text())["round"] == 7


def _stub_run(monkeypatch, backbone_name, pooling="mean"):
    """export_run's rebuilt run stubbed by a tiny BERT classifier (`pooling`, a linear head) of a
    run on --backbone=`backbone_name` (the export's values are checked against numpy in
    tests/models/test_peft_export.py)."""
    import types

    from models import backbones, checkpoints
    from models.lora_targets import LoraConfig, apply_lora

    try:
        checkpoints.fetch_minilm()   # the text tasks' vocabulary, which the export ships
    except checkpoints.CheckpointUnavailableError as e:
        pytest.skip(f"all-MiniLM-L6-v2 vocabulary unavailable offline: {e}")
    backbone = backbones.build_bert_backbone(vocabulary_size=30, num_layers=2, num_heads=2,
                                             hidden_dim=8, intermediate_dim=16,
                                             max_sequence_length=16)
    apply_lora(backbone, LoraConfig(rank=2, targets=("query", "value")))
    model = backbones.build_classifier(backbone, num_classes=2, pooling=pooling)
    meta = {"round": 3, "config": {"task": "sst2", "backbone": backbone_name}}
    run = types.SimpleNamespace(model=types.SimpleNamespace(backbone=backbone_name),
                                task=types.SimpleNamespace(sequence_length=16))
    monkeypatch.setattr(export, "trained_model", lambda *args: (model, meta, run, None))


def test_a_tiny_run_names_its_exported_base_by_its_absolute_path(tmp_path, monkeypatch):
    """PEFT and sentence-transformers resolve a relative base against the working directory;
    the export, asked for a relative folder, names base/ by its absolute path."""
    _stub_run(monkeypatch, "tiny")
    monkeypatch.chdir(tmp_path)
    record = export.export_run("run", "out")
    out = tmp_path / "out"
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((out / "base").resolve()) == record[
        "base_model_name_or_path"]
    assert pathlib.Path(config["base_model_name_or_path"]).is_absolute()
    assert {p.name for p in (out / "base").iterdir()} == {"config.json", "model.safetensors",
                                                          "vocab.txt"}
    assert config["task_type"] == record["task_type"] == "FEATURE_EXTRACTION"
    # The folder loads whole in sentence-transformers: its tokenizer and pipeline are there.
    for name in ("vocab.txt", "tokenizer_config.json", "modules.json", "1_Pooling/config.json",
                 "2_Dense/model.safetensors"):
        assert (out / name).is_file(), name
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 16


def test_a_minilm_run_names_the_hub_model(tmp_path, monkeypatch):
    _stub_run(monkeypatch, "minilm")
    record = export.export_run(tmp_path / "run", tmp_path / "out")
    config = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert record["base_exported"] is False and not (tmp_path / "out" / "base").exists()


def test_a_form_that_would_not_reproduce_the_run_is_one_line_and_status_2(tmp_path, monkeypatch,
                                                                          capsys):
    _stub_run(monkeypatch, "tiny")
    out = tmp_path / "out"
    assert export_adapters.run_command_line(
        ["export_adapters.py", f"--run_dir={tmp_path}", f"--output_dir={out}",
         "--task_type=SEQ_CLS"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("export_adapters.py: error: task_type=SEQ_CLS: pooling='mean' with "
                          "head='linear' is not what HF's BertForSequenceClassification computes")
    assert "export it as FEATURE_EXTRACTION" in err and err.count("\n") == 1
    assert not out.exists()
    _stub_run(monkeypatch, "tiny", pooling="pooler")   # HF's own function: SEQ_CLS by default
    assert export_adapters.run_command_line(
        ["export_adapters.py", f"--run_dir={tmp_path}", f"--output_dir={out}"]) == 0
    assert json.loads((out / "adapter_config.json").read_text())["task_type"] == "SEQ_CLS"
    assert "as SEQ_CLS" in capsys.readouterr().out


def test_a_prefix_cached_run_exports_the_base_assembled_from_its_two_models(tmp_path,
                                                                           monkeypatch):
    """A run on the frozen-prefix split trains a suffix classifier with no backbone of its own:
    the export assembles base/ from the task's prefix model (`PrefixCache.prefix_model`) and
    the suffix's encoders, and the folder rebuilds the whole classifier's logits."""
    import types

    from models import backbones, checkpoints, hf_bert, peft_export, prefix
    from models.lora_targets import LoraConfig, apply_lora
    from tasks.prefix_cache import PrefixCache

    try:
        checkpoints.fetch_minilm()   # the text tasks' vocabulary, which the export ships
    except checkpoints.CheckpointUnavailableError as e:
        pytest.skip(f"all-MiniLM-L6-v2 vocabulary unavailable offline: {e}")
    lora = LoraConfig(rank=2, targets=("query", "value"), layers=(1,))
    backbone = backbones.build_bert_backbone(vocabulary_size=30, num_layers=2, num_heads=2,
                                             hidden_dim=8, intermediate_dim=16,
                                             max_sequence_length=16)
    apply_lora(backbone, lora)
    whole = backbones.build_classifier(backbone, num_classes=2, pooling="mean")
    rng = np.random.default_rng(0)
    for v in whole.weights:   # every weight away from its initial value
        v.assign(rng.normal(0.0, 0.3, v.shape).astype(np.float32))
    suffix = prefix.SuffixSpec.from_backbone(backbone, 1, pooling="mean").build_classifier(
        lora, num_classes=2)
    for variable, source in zip(suffix.variables, prefix.matching_variables(whole, suffix)):
        variable.assign(source)
    meta = {"round": 3, "config": {"task": "sst2", "backbone": "tiny"}}
    run = types.SimpleNamespace(model=types.SimpleNamespace(backbone="tiny"),
                                task=types.SimpleNamespace(sequence_length=16))
    task = types.SimpleNamespace(
        prefix_cache=PrefixCache(lambda: prefix.build_prefix_model(backbone, 1)))
    monkeypatch.setattr(export, "trained_model", lambda *args: (suffix, meta, run, task))
    out = tmp_path / "out"
    assert export.export_run(tmp_path / "run", out)["base_exported"]

    rebuilt, _ = hf_bert.load_hf_bert(out / "base")
    apply_lora(rebuilt, lora)
    model = backbones.build_classifier(rebuilt, num_classes=2, pooling="mean")
    peft_export.import_peft(model, out)
    ids = rng.integers(1, 30, (3, 9)).astype(np.int32)
    batch = {"token_ids": ids, "padding_mask": np.ones_like(ids),
             "segment_ids": np.zeros_like(ids)}
    np.testing.assert_allclose(model(batch).numpy(), whole(batch).numpy(), rtol=0, atol=1e-5)
