r"""Exports a training run's LoRA adapters (and trained head) in Hugging Face PEFT's format, in
the form that computes the run's logits outside tffl.

    uv run python scripts/export_adapters.py --run_dir=runs/sst2-rolora --output_dir=adapters/
    uv run python scripts/export_adapters.py --run_dir=... --output_dir=... --data_dir=../shared/data

Reads the newest checkpoint of --run_dir (`checkpoints/round_xxxxxx/`, `tffl.simulation.checkpoint`)
and the run's configuration (its `config.json`; for runs from before it, the identity its
`meta.json` recorded, `runner.training.run_identity`), rebuilds the task and the
algorithm's process from it exactly as `scripts/train.py` does, loads the state into it and sets
the client model to `process.model_weights(state)` (`runner.trained_run.trained_model`),
then writes `models.peft_export.export_peft`'s folder, plus `export.json` (run, round, flags,
task type).

The form (PEFT task type) is the one that reproduces the classifier (`export_task_type`;
docs/models.md): SEQ_CLS for `--pooling=pooler --head=linear` (HF's
`BertForSequenceClassification`); FEATURE_EXTRACTION for every other text classifier, e.g. the
default mean pooling: the adapters of `BertModel`, the pooling and head as sentence-transformers
modules (`modules.json`, `1_Pooling/`, `2_Dense/`) and the tokenizer files (the text tasks:
sst2, reviews and a user's `text` run); CAUSAL_LM for the instruction tasks (sst2_instruct,
reviews_instruct and a user's `instruct` run) on --backbone=gemma3_270m, adapters of
`google/gemma-3-270m`'s modules, trained on the weights dequantized from its Q4_K_M GGUF.
--task_type asks for a form; one that would compute other logits (SEQ_CLS for mean pooling) is
refused with one line on stderr (exit status 2), and nothing is written.

`adapter_config.json` names the base model as an absolute path or a hub name: all-MiniLM-L6-v2's
`sentence-transformers/all-MiniLM-L6-v2`, Gemma 3's `google/gemma-3-270m`; the random tiny
backbone has no other home than `<output_dir>/base/`, a HF `BertModel` checkpoint
(`config.json`, `model.safetensors`, `vocab.txt`; with the prefix cache, assembled from the
prefix model's embeddings and lower encoders and the client model's upper ones), named by its
absolute path (moving the folder means editing `base_model_name_or_path`, or exporting again
with --base_model_name_or_path).

--data_dir and --frozen_dir replace the recorded ones (runs from before config.json did not
record them). The gpt2_tiny decoder is a random byte-level toy with no Hugging Face
counterpart, so its runs do not export.
"""

from __future__ import annotations

import json
import pathlib
import shutil

from absl import app
from absl import flags

from runner.trained_run import trained_model


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This script's flags (defined when it runs, not on import: train.py's share names)."""
    where = {"flag_values": flag_values}
    flags.DEFINE_string("run_dir", None, "The training run's folder (--output_dir of "
                        "scripts/train.py; for several algorithms, its <algorithm>/ one).", **where)
    flags.DEFINE_string("output_dir", None, "Where the PEFT adapter folder goes.", **where)
    flags.DEFINE_string("data_dir", None, "--data_dir the run was trained with.", **where)
    flags.DEFINE_string("frozen_dir", None, "--frozen_dir the run was trained with.", **where)
    flags.DEFINE_string(
        "base_model_name_or_path", None, "adapter_config.json's base model (default: "
        "sentence-transformers/all-MiniLM-L6-v2 for --backbone=minilm runs, google/gemma-3-270m "
        "for gemma3_270m, else the absolute path of the exported base/)", **where)
    flags.DEFINE_enum(
        "task_type", None, ["SEQ_CLS", "FEATURE_EXTRACTION", "CAUSAL_LM"],
        "The PEFT form (default: the one that reproduces the run's logits, "
        "models.peft_export.export_task_type); a form that would not is refused", **where)


MINILM_HUB_NAME = "sentence-transformers/all-MiniLM-L6-v2"
def _check_exportable(run_dir, config: dict) -> None:
    """A one-line ValueError unless the run's task and backbone have a PEFT counterpart."""
    from models.decoders import HUB_NAMES
    from tasks.instruct_run_task import INSTRUCT_TASKS
    from tasks.text_run_task import TEXT_TASKS

    task, backbone = config.get("task"), config.get("backbone")
    if task not in TEXT_TASKS + INSTRUCT_TASKS:
        raise ValueError(f"run_dir={run_dir}: task {task!r} has no LoRA backbone; PEFT export "
                         f"covers {', '.join(TEXT_TASKS + INSTRUCT_TASKS)}")
    if task in INSTRUCT_TASKS and backbone not in HUB_NAMES:
        raise ValueError(f"run_dir={run_dir}: backbone {backbone!r} has no Hugging Face "
                         f"counterpart to adapt; PEFT export covers the decoders "
                         f"{', '.join(HUB_NAMES)}")


def _named_layers(model) -> dict:
    return {layer.name: layer for layer in model._flatten_layers(include_self=False,
                                                                  recursive=True)}


def base_checkpoint_of_parts(task, model) -> tuple[dict, dict]:
    """`(tensors, config)` of the whole frozen BERT backbone of a prefix-cached run, as a HF
    `BertModel`: embeddings and encoders < k from the prefix model (`task.prefix_cache`), encoders
    >= k (their frozen kernels) and a trained pooler from the client model. A pooler the classifier
    never reads is written as zeros."""
    import re

    import numpy as np

    from models import hf_weights

    cache = task.prefix_cache
    prefix = cache._prefix if hasattr(cache._prefix, "layers") else cache._prefix()
    layers = _named_layers(prefix)
    encoders = {n: v for n, v in (layers | _named_layers(model)).items()
                if re.fullmatch(r"transformer_layer_\d+", n)}
    encoders = [encoders[f"transformer_layer_{i}"] for i in range(len(encoders))]
    token = layers["token_embedding"].embeddings.numpy()
    hidden, heads = token.shape[1], encoders[0].num_heads
    ln = layers["embeddings_layer_norm"]
    tensors = {"embeddings.word_embeddings.weight": token,
               "embeddings.position_embeddings.weight":
                   layers["position_embedding"].position_embeddings.numpy(),
               "embeddings.token_type_embeddings.weight":
                   layers["segment_embedding"].embeddings.numpy(),
               "embeddings.LayerNorm.weight": ln.gamma.numpy(),
               "embeddings.LayerNorm.bias": ln.beta.numpy()}
    for i, encoder in enumerate(encoders):
        for name, variable, _, to_hf in hf_weights.encoder_pairs(encoder, i, heads, hidden):
            tensors[name] = to_hf(variable.numpy())
    pooler = _named_layers(model).get("pooled_dense")
    tensors["pooler.dense.weight"] = (np.zeros((hidden, hidden)) if pooler is None
                                      else pooler.kernel.numpy().T)
    tensors["pooler.dense.bias"] = (np.zeros(hidden) if pooler is None
                                    else pooler.bias.numpy())
    holder = type("Encoders", (), {"transformer_layers": encoders})
    config = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": int(hidden),
              "num_hidden_layers": len(encoders), "num_attention_heads": int(heads),
              "intermediate_size": int(encoders[0].intermediate_dim),
              "hidden_act": hf_weights.hidden_act(holder), "vocab_size": int(token.shape[0]),
              "max_position_embeddings": int(tensors["embeddings.position_embeddings.weight"]
                                             .shape[0]),
              "type_vocab_size": int(tensors["embeddings.token_type_embeddings.weight"].shape[0]),
              "layer_norm_eps": 1e-12, "position_embedding_type": "absolute", "pad_token_id": 0}
    return ({f"bert.{k}": np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
            config)


def save_base(task, model, folder: pathlib.Path) -> None:
    """Writes the run's frozen backbone as a HF checkpoint (`config.json`, `model.safetensors`)."""
    import safetensors.numpy

    from models import hf_weights

    if _has_backbone(model):
        hf_weights.save_hf_checkpoint(hf_weights.find_backbone(model), folder)
        return
    tensors, config = base_checkpoint_of_parts(task, model)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
    safetensors.numpy.save_file(tensors, str(folder / "model.safetensors"),
                                metadata={"format": "pt"})


def export_run(run_dir, output_dir, data_dir=None, frozen_dir=None, base_model=None,
               task_type=None) -> dict:
    """Writes the PEFT folder of `run_dir`'s newest checkpoint to `output_dir` (and, for a
    random backbone, its frozen base to `output_dir/base`, named by its absolute path); returns
    `export.json`'s record. A `task_type` that would not reproduce the run's logits is a
    `ValueError`, raised before anything is written."""
    from models import peft_export
    from models.decoders import HUB_NAMES

    run_dir, output_dir = pathlib.Path(run_dir), pathlib.Path(output_dir)
    model, meta, config, task = trained_model(
        run_dir, data_dir, frozen_dir, lambda recorded: _check_exportable(run_dir, recorded))
    decoder = HUB_NAMES.get(config.model.backbone)
    family = "gemma3" if decoder else "bert"
    task_type = peft_export.export_task_type(model, family, task_type)
    export_base = config.model.backbone != "minilm" and decoder is None
    if base_model is None:
        base_model = decoder or (MINILM_HUB_NAME if not export_base
                                 else str((output_dir / "base").resolve()))
    vocabulary = max_length = None
    if decoder is None:
        from models import checkpoints
        from tasks import text_run_task

        # The text tasks tokenize with all-MiniLM-L6-v2's WordPiece vocabulary, tiny included.
        folder = checkpoints.fetch_minilm()
        vocabulary = folder / "vocab.txt"
        max_length = (config.task.sequence_length
                      or text_run_task.default_max_length(config.model.backbone, folder))
    peft_export.export_peft(model, output_dir, base_model_name_or_path=base_model,
                            family=family, task_type=task_type, vocabulary=vocabulary,
                            max_seq_length=max_length)
    if export_base:
        save_base(task, model, output_dir / "base")
        shutil.copy(vocabulary, output_dir / "base" / "vocab.txt")
    record = {"run_dir": str(run_dir), "round": meta["round"], "flags": meta["config"],
              "base_model_name_or_path": base_model, "base_exported": export_base,
              "task_type": task_type}
    if decoder is not None:   # how the training rows were prompted, for scripts/generate.py
        from tasks import instruct_run_task
        from tasks.task_config import TaskConfig

        flags = meta["config"]   # the run's identity: its task, and its training file if any
        record["prompt_style"] = instruct_run_task.prompt_style(
            TaskConfig(task=flags["task"], train_file=flags.get("train_file")))
    (output_dir / "export.json").write_text(json.dumps(record, indent=1, sort_keys=True))
    return record


def _has_backbone(model) -> bool:
    from models import hf_weights

    try:
        hf_weights.find_backbone(model)
    except ValueError:
        return False
    return True


def main(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    from runner import cli

    del argv
    f = flag_values
    if not f.run_dir or not f.output_dir:
        return cli.error_exit("export_adapters.py", ValueError(
            "--run_dir and --output_dir are required"), 2)
    try:
        record = export_run(f.run_dir, f.output_dir, f.data_dir, f.frozen_dir,
                            f.base_model_name_or_path, f.task_type)
    except ValueError as e:
        return cli.error_exit("export_adapters.py", e, 2)
    print(f"exported round {record['round']} of {record['run_dir']} to {f.output_dir} as "
          f"{record['task_type']}")
    return 0


def run_command_line(argv: list[str]) -> int:
    """`export_adapters.py <argv[1:]>` in this process, with flags of its own (absl's global
    ones stay untouched); returns the exit status."""
    flag_values = flags.FlagValues()
    define_flags(flag_values)
    try:
        flag_values(argv)
    except flags.Error as e:
        from runner import cli

        return cli.error_exit("export_adapters.py", e, 2)
    return main(argv, flag_values)


if __name__ == "__main__":
    from runner import tensorflow_import

    tensorflow_import.import_tensorflow()  # before app.run's main, where Keras could not build
    define_flags()
    app.run(main)
