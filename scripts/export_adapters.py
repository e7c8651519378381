r"""Exports a training run's LoRA adapters (and trained head) in Hugging Face PEFT's format, in
the form that computes the run's logits outside tffl.

    uv run python scripts/export_adapters.py --run_dir=runs/sst2-rolora --output_dir=adapters/
    uv run python scripts/export_adapters.py --run_dir=... --output_dir=... --data_dir=../shared/data

Reads the newest checkpoint of --run_dir and the run's configuration, rebuilds its model exactly
as `scripts/train.py` built it and writes the PEFT folder, plus `export.json` (run, round, flags,
task type): `runner.export.export_run`, whose docstring says which form each run takes (PEFT
task type SEQ_CLS, FEATURE_EXTRACTION with sentence-transformers modules, or CAUSAL_LM) and
where the base model is named or written (`<output_dir>/base/` for the random tiny backbone).
--task_type asks for a form; one that would compute other logits (SEQ_CLS for mean pooling) is
refused with one line on stderr (exit status 2), and nothing is written.

--data_dir and --frozen_dir replace the recorded ones (runs from before config.json did not
record them). The gpt2_tiny decoder is a random byte-level toy with no Hugging Face
counterpart, so its runs do not export.
"""

from __future__ import annotations

from absl import app
from absl import flags

from runner import cli
from runner import export


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
        "runner.export); a form that would not is refused", **where)


def main(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    del argv
    f = flag_values
    if not f.run_dir or not f.output_dir:
        return cli.error_exit("export_adapters.py", ValueError(
            "--run_dir and --output_dir are required"), 2)
    try:
        record = export.export_run(f.run_dir, f.output_dir, f.data_dir, f.frozen_dir,
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
        return cli.error_exit("export_adapters.py", e, 2)
    return main(argv, flag_values)


if __name__ == "__main__":
    from runner import tensorflow_import

    tensorflow_import.import_tensorflow()  # before app.run's main, where Keras could not build
    define_flags()
    app.run(main)
