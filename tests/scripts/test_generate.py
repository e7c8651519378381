"""scripts/generate.py, in this process: a trained instruction run's (or an exported PEFT
folder's) greedy continuations, against greedy decoding computed here, one token at a time, from
the checkpoint's weights (or the adapted model that was exported), with the prompt templated
as written out here; and the one-line refusals.

The large tier trains a tiny --task=instruct run on gpt2_tiny (Alpaca rows written here) and
loads the real Gemma 3 270M (when its GGUF is in the cache); the fast tier checks the PEFT path
on a tiny random Gemma 3 standing in for gemma3_270m, and every refusal."""

import json

import numpy as np
import pytest

from scripts import generate
from tasks import instructions

SCRIPT_ERROR = "generate.py: error: "


def _generate(capsys, *args):
    """(exit status, stdout, stderr) of `generate.py <args>` in this process."""
    capsys.readouterr()
    status = generate.run_command_line(["generate.py", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _one_line_error(capsys, args, message):
    status, _, err = _generate(capsys, *args)
    assert status == 2, err
    assert err.startswith(SCRIPT_ERROR) and err.count("\n") == 1, err
    assert message in err, err


def _json_lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _blocks(records):
    """What the script prints per prompt for these JSON Lines records."""
    n = len(records)
    return ["\n".join([f"=== prompt {k}/{n} ===", r["prompt"], f"=== continuation {k}/{n} ===",
                       r["continuation"]]) for k, r in enumerate(records, start=1)]


# -- refusals (fast) --------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--prompt=hi"], "give --run_dir=<training run folder> or --peft_dir=<PEFT adapter "
                      "folder>, one of the two"),
    (["--run_dir=a", "--peft_dir=b", "--prompt=hi"], "one of the two"),
    (["--run_dir=a"], "give the prompts as --prompt=<text> (repeatable) or "
                      "--prompts_file=<file>, one of the two"),
    (["--run_dir=a", "--prompt="], "flag --prompt: prompt 1 is empty"),
    (["--run_dir=a", "--prompt=hi", "--prompt=  "], "flag --prompt: prompt 2 is empty"),
    (["--run_dir=a", "--prompt=hi", "--prompt=ho", "--input=x"],
     "flag --prompt: 1 inputs for 2 prompts"),
    (["--run_dir=a", "--prompt=hi", "--input=x", "--raw"],
     "inputs go into Alpaca's template; prompts as written have none"),
    (["--run_dir=a", "--prompts_file=p.txt", "--input=x"], "flag --input: Alpaca's input of a "
                                                           "--prompt"),
    (["--run_dir=a", "--prompt=hi", "--max_new_tokens=0"], "flag --max_new_tokens=0: must be "
                                                           ">= 1"),
    (["--peft_dir=a", "--prompt=hi", "--data_dir=d"], "flag --data_dir: rebuilds a --run_dir's "
                                                      "task"),
    (["--run_dir=a", "--prompt=hi", "--temperature=1"], "Unknown command line flag"),
])
def test_bad_flags_are_one_line(capsys, args, message):
    _one_line_error(capsys, args, message)


def test_an_empty_prompts_file_is_one_line(tmp_path, capsys):
    (tmp_path / "p.txt").write_text("\n  \n")
    _one_line_error(capsys, [f"--run_dir={tmp_path}", f"--prompts_file={tmp_path / 'p.txt'}"],
                    f"flag --prompts_file={tmp_path / 'p.txt'}: {tmp_path / 'p.txt'}: no prompts")


def _fake_checkpoint(folder, task, backbone):
    """A run folder whose newest checkpoint records `task` on `backbone` (its meta.json)."""
    path = folder / "checkpoints" / "round_000003"
    path.mkdir(parents=True)
    (path / "meta.json").write_text(json.dumps(
        {"round": 3, "config": {"task": task, "backbone": backbone, "algorithm": "fedavg"}}))


def test_folders_that_hold_no_decoder_run_are_one_line(tmp_path, capsys):
    from runner.run_config import RunConfig

    _one_line_error(capsys, [f"--run_dir={tmp_path / 'gone'}", "--prompt=hi"],
                    f"run_dir={tmp_path / 'gone'}: no such folder")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(RunConfig().with_changes(task="instruct").to_json())
    _one_line_error(capsys, [f"--run_dir={empty}", "--prompt=hi"],
                    f"run_dir={empty}: no checkpoint under checkpoints/")
    _fake_checkpoint(tmp_path / "sst2", "sst2", "tiny")
    _one_line_error(capsys, [f"--run_dir={tmp_path / 'sst2'}", "--prompt=hi"],
                    f"run_dir={tmp_path / 'sst2'}: task 'sst2' on backbone 'tiny' is not a "
                    "decoder language model; generation needs a run of sst2_instruct, "
                    "reviews_instruct, instruct on gpt2_tiny or gemma3_270m")
    compared = tmp_path / "compared"
    for name in ("rolora", "fedavg_lora"):
        _fake_checkpoint(compared / name, "instruct", "gpt2_tiny")
    (compared / "config.json").write_text(
        RunConfig().with_changes(algorithm=["rolora", "fedavg_lora"]).to_json())
    _one_line_error(capsys, [f"--run_dir={compared}", "--prompt=hi"],
                    f"the output folder of a comparison of 2 runs; pass one of their folders: "
                    f"{compared / 'fedavg_lora'}, {compared / 'rolora'}")


def test_a_run_whose_training_file_is_elsewhere_is_one_line(tmp_path, capsys, monkeypatch):
    """The task is rebuilt from --train_file, which config.json records as it was given."""
    from runner.run_config import RunConfig

    _fake_checkpoint(tmp_path / "run", "instruct", "gpt2_tiny")
    (tmp_path / "run" / "config.json").write_text(RunConfig().with_changes(
        task="instruct", backbone="gpt2_tiny", train_file="alpaca.json").to_json())
    monkeypatch.chdir(tmp_path)
    _one_line_error(capsys, ["--run_dir=run", "--prompt=hi"],
                    "run_dir=run: the run's train_file alpaca.json is not there")


def test_peft_folders_that_are_no_decoders_adapters_are_one_line(tmp_path, capsys):
    _one_line_error(capsys, [f"--peft_dir={tmp_path}", "--prompt=hi"],
                    f"peft_dir={tmp_path}: no adapter_config.json there")
    (tmp_path / "adapter_config.json").write_text(json.dumps(
        {"task_type": "FEATURE_EXTRACTION", "base_model_name_or_path": "/abs/base"}))
    _one_line_error(capsys, [f"--peft_dir={tmp_path}", "--prompt=hi"],
                    "a FEATURE_EXTRACTION folder (a classifier's or an encoder's adapters); "
                    "generation needs the CAUSAL_LM adapters of a decoder")
    (tmp_path / "adapter_config.json").write_text(json.dumps(
        {"task_type": "CAUSAL_LM", "base_model_name_or_path": "meta-llama/Llama-3.2-1B"}))
    _one_line_error(capsys, [f"--peft_dir={tmp_path}", "--prompt=hi"],
                    "base model 'meta-llama/Llama-3.2-1B' is no tffl decoder; generation from "
                    "a PEFT folder covers google/gemma-3-270m (gemma3_270m)")


# -- the PEFT path, on a tiny Gemma 3 standing in for gemma3_270m (fast) ----------------------

TINY_GEMMA = {"vocabulary_size": 300, "num_layers": 2, "num_query_heads": 2,
              "num_key_value_heads": 1, "hidden_dim": 16, "intermediate_dim": 32, "head_dim": 8,
              "sliding_window": 4, "global_layer_every": 2}


def _tiny_gemma_decoder():
    """A `models.decoders.Decoder` over a tiny random Gemma 3 (fixed "pretrained" weights) with
    a byte tokenizer (id = byte + 3; begin of text 2, end 1, padding 0), detokenizing to the ids
    themselves, so that continuations compare token for token."""
    import tensorflow as tf

    from models.decoders import Decoder
    from models.gemma3_backbone import Gemma3Backbone, Gemma3BackboneConfig

    rng = np.random.default_rng(0)

    def value(variable):   # norms near 1 and a small embedding: the layers, LoRA's too, count
        if "scale" in variable.name:
            return 1.0 + rng.normal(0.0, 0.1, variable.shape).astype(np.float32)
        return rng.normal(0.0, 0.05 if "embeddings" in variable.name else 0.3,
                          variable.shape).astype(np.float32)

    base = [value(v) for v in Gemma3Backbone(Gemma3BackboneConfig(**TINY_GEMMA)).weights]

    def pretrained():
        backbone = Gemma3Backbone(Gemma3BackboneConfig(**TINY_GEMMA))
        backbone.set_weights(base)
        return backbone

    return Decoder(
        "gemma3_270m", "tiny random Gemma 3", lambda: Gemma3Backbone(Gemma3BackboneConfig(**TINY_GEMMA)), pretrained,
        tokenize=lambda texts: [[b + 3 for b in t.encode("utf-8")] for t in texts],
        detokenize=lambda ids: ",".join(map(str, ids)), tokenizer=tf.identity,
        bos_id=2, eos_id=1, pad_id=0, max_length=64,
        lora_targets=("query", "key", "value", "attention_output", "ffn_gate", "ffn_in",
                      "ffn_out"))


def _export_adapted(decoder, folder, monkeypatch):
    """The decoder's pretrained backbone with random LoRA factors on layer 1's query and value,
    exported as runner.export exports a gemma3_270m sst2_instruct run; returns the
    adapted backbone."""
    import types

    from models import causal_lm
    from models.lora_targets import LoraConfig, apply_lora, lora_layers
    from runner import export

    backbone = decoder.pretrained_fn()
    apply_lora(backbone, LoraConfig(rank=2, alpha=4.0, targets=("query", "value"),
                                    layers=(1,)))
    rng = np.random.default_rng(1)
    for wrapper in lora_layers(backbone):
        for v in (wrapper.lora_a, wrapper.lora_b):
            v.assign(rng.normal(0.0, 0.5, v.shape).astype(np.float32))
    meta = {"round": 4, "config": {"task": "sst2_instruct", "backbone": "gemma3_270m"}}
    run = types.SimpleNamespace(model=types.SimpleNamespace(backbone="gemma3_270m"))
    monkeypatch.setattr(export, "trained_model",
                        lambda *args: (causal_lm.build_causal_lm(backbone), meta, run, None))
    record = export.export_run(folder.parent / "run", folder)
    assert record["task_type"] == "CAUSAL_LM"
    return backbone


def test_a_peft_folder_generates_as_the_adapted_model_it_was_exported_from(
        tmp_path, monkeypatch, capsys):
    """The folder's base loaded by name, LoRA where its adapters sit, their values: the
    continuations are those of the exported model itself (one prompt at a time, here), and
    differ from the base's; a bare prompt is a review, as the run's rows were."""
    from models import causal_lm, decoders

    decoder = _tiny_gemma_decoder()
    monkeypatch.setattr(decoders, "build_decoder", lambda name: {"gemma3_270m": decoder}[name])
    adapted = _export_adapted(decoder, tmp_path / "adapters", monkeypatch)
    prompts = ["a gorgeous movie.", "flat."]
    status, out, err = _generate(capsys, f"--peft_dir={tmp_path / 'adapters'}",
                                 *[f"--prompt={p}" for p in prompts], "--max_new_tokens=6",
                                 f"--output_file={tmp_path / 'out.jsonl'}")
    assert status == 0, err
    records = _json_lines(tmp_path / "out.jsonl")
    texts = [instructions.SENTIMENT_PROMPT.format(text=p) for p in prompts]
    assert [r["prompt"] for r in records] == ["Review: a gorgeous movie.\nSentiment:",
                                              "Review: flat.\nSentiment:"] == texts
    base = decoder.pretrained_fn()
    differs = []
    for text, record in zip(texts, records):
        ids = [2] + [b + 3 for b in text.encode("utf-8")]
        expected = causal_lm.greedy_generate(adapted, ids, 6, stop_ids=[1])
        assert record["continuation"] == ",".join(map(str, expected))
        differs.append(expected != causal_lm.greedy_generate(base, ids, 6, stop_ids=[1]))
    assert any(differs)   # the adapters, not the base alone, made these continuations
    assert "r=2 on query,value of layers 1, base google/gemma-3-270m as gemma3_270m" in out
    assert "bare prompts as reviews" in out
    for block in _blocks(records):
        assert block in out
    # --raw: the prompts as written.
    status, out, err = _generate(capsys, f"--peft_dir={tmp_path / 'adapters'}", "--raw",
                                 "--prompt=flat.", "--max_new_tokens=3",
                                 f"--output_file={tmp_path / 'raw.jsonl'}")
    assert status == 0, err
    [record] = _json_lines(tmp_path / "raw.jsonl")
    assert record["prompt"] == "flat."
    assert record["continuation"] == ",".join(map(str, causal_lm.greedy_generate(
        adapted, [2] + [b + 3 for b in b"flat."], 3, stop_ids=[1])))


# -- a trained gpt2_tiny instruction run (large) ------------------------------------------------

ROWS = [{"instruction": "Add the numbers.", "input": f"{a} and {b}", "output": str(a + b)}
        for a, b in [(2, 3), (1, 4), (6, 2), (0, 7), (5, 5), (3, 8), (4, 1), (7, 7)] * 3]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(run folder, Alpaca file) of a 2-round FedAvg-LoRA --task=instruct run on gpt2_tiny."""
    from scripts import train

    root = tmp_path_factory.mktemp("generate_run")
    (root / "alpaca.json").write_text(json.dumps(ROWS, indent=1))
    run = root / "run"
    assert train.run_command_line([
        "train.py", "--task=instruct", "--backbone=gpt2_tiny",
        f"--train_file={root / 'alpaca.json'}", "--algorithm=fedavg_lora", "--rounds=2",
        "--local_steps=2", "--batch_size=4", "--rank=2", "--learning_rate=0.5",
        "--partition=iid", "--num_clients=2", "--clients_per_round=2", "--eval_every=2",
        f"--output_dir={run}"]) == 0
    return run, root / "alpaca.json"


@pytest.fixture(scope="module")
def checkpoint_model(trained):
    """The run's causal LM with its newest checkpoint's weights, rebuilt here from config.json
    and `process.model_weights`; its trainable variables checked against the checkpoint's
    arrays by name."""
    import tensorflow as tf

    from runner import training
    from runner.run_config import RunConfig
    from tffl.runtime import distribute
    from tffl.simulation import checkpoint

    run, _ = trained
    config = RunConfig.from_json((run / "config.json").read_text())
    _, folder = checkpoint.latest(run / "checkpoints")
    assert folder.name == "round_000002"
    meta = json.loads((folder / "meta.json").read_text())
    tf.keras.utils.set_random_seed(config.algorithm.seed)
    with distribute.distribute_runtime():
        task = training.run_task_for("fedavg_lora", config)
        process = training.build_run_process("fedavg_lora", task, config)
        assert process.frozen_fingerprint == meta["frozen_fingerprint"]
        state, _, _ = checkpoint.load(folder, template=process.initialize())
        weights = process.model_weights(state)
    model = task.keras_model_fn()
    weights.assign_weights_to(model)
    stored = np.load(folder / "state.npz")
    lora_b = 0.0
    for variable in model.trainable_variables:
        name = "global_model_weights/trainable/" + variable.name.removesuffix(":0")
        np.testing.assert_array_equal(variable.numpy(), stored[name])
        lora_b += float(np.abs(variable.numpy()).sum()) if "lora_b" in name else 0.0
    assert lora_b > 0   # training moved the adapters off B = 0
    return model


def _greedy_bytes(model, prompt, steps):
    """gpt2_tiny's greedy continuation of `prompt` by the causal LM's own call: begin of text
    (256) and the prompt's UTF-8 bytes; each step puts a placeholder token after the sequence and
    reads the logits that predict it (the response mask on it), takes their argmax, and stops
    at end of text (256)."""
    ids = [256] + list(prompt.encode("utf-8"))
    out = []
    for _ in range(steps):
        row = ids + out + [0]
        response = np.zeros((1, len(row)), np.int32)
        response[0, -1] = 1
        logits = model({"token_ids": np.array([row], np.int32),
                        "padding_mask": np.ones((1, len(row)), np.int32),
                        "response_mask": response}).numpy()
        token = int(np.argmax(logits[0]))
        if token == 256:
            break
        out.append(token)
    return bytes(out).decode("utf-8", "replace")


@pytest.fixture(scope="module")
def rebuilt_once():
    """generate.py's rebuild of the run (`runner.trained_run.trained_model`: task, TFF process,
    checkpoint) done by the first generation from a run folder and kept for the module's others:
    each test checks its prompts and continuations against `checkpoint_model`, which rebuilds
    the run on its own; building the same process again would check nothing more."""
    from runner import trained_run

    built = {}
    trained_model = trained_run.trained_model

    def once(*args):
        key = tuple(map(str, args))
        if key not in built:
            built[key] = trained_model(*args)
        return built[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trained_run, "trained_model", once)
        yield built


@pytest.mark.large
def test_a_bare_prompt_of_an_alpaca_run_gets_its_template_and_the_checkpoints_continuation(
        trained, checkpoint_model, rebuilt_once, tmp_path, capsys):
    run, _ = trained
    status, out, err = _generate(capsys, f"--run_dir={run}", "--prompt=Add the numbers.",
                                 "--input=2 and 3", "--prompt=Name a colour.", "--input=",
                                 "--max_new_tokens=12", f"--output_file={tmp_path / 'out.jsonl'}")
    assert status == 0, err
    records = _json_lines(tmp_path / "out.jsonl")
    expected_prompts = [
        instructions.ALPACA_PROMPT.format(instruction="Add the numbers.", input="2 and 3"),
        instructions.ALPACA_PROMPT_NO_INPUT.format(instruction="Name a colour.")]
    assert [r["prompt"] for r in records] == expected_prompts
    assert [r["continuation"] for r in records] == [
        _greedy_bytes(checkpoint_model, p, 12) for p in expected_prompts]
    assert f"generating from round 2 of {run} (fedavg_lora, instruct on gpt2_tiny); bare " \
           "prompts in Alpaca's template; greedy, up to 12 new tokens" in out
    for block in _blocks(records):
        assert block in out


@pytest.mark.large
def test_a_prompts_file_of_rows_is_prompted_as_training_rows_with_references(
        trained, checkpoint_model, rebuilt_once, tmp_path, capsys):
    run, _ = trained
    (tmp_path / "ask.jsonl").write_text(
        json.dumps({"instruction": "Add the numbers.", "input": "6 and 2", "output": "8"})
        + "\n" + json.dumps({"prompt": "2 and 3 make"}) + "\n")
    status, out, err = _generate(capsys, f"--run_dir={run}",
                                 f"--prompts_file={tmp_path / 'ask.jsonl'}", "--max_new_tokens=8",
                                 "--batch_size=1", f"--output_file={tmp_path / 'out.jsonl'}")
    assert status == 0, err
    first = instructions.ALPACA_PROMPT.format(instruction="Add the numbers.", input="6 and 2")
    assert _json_lines(tmp_path / "out.jsonl") == [
        {"prompt": first, "continuation": _greedy_bytes(checkpoint_model, first, 8),
         "reference": "8"},
        {"prompt": "2 and 3 make",
         "continuation": _greedy_bytes(checkpoint_model, "2 and 3 make", 8)}]
    assert "=== reference 1/2 ===\n8\n" in out and "reference 2/2" not in out


# -- the real Gemma 3 270M (large; its GGUF from the cache) ------------------------------------
