r"""Greedy text generation from a trained instruction run, or from exported PEFT adapters.

    uv run --locked python scripts/generate.py --run_dir=runs/x/rolora \
        --prompt="Add the numbers." --input="2 and 3" --max_new_tokens=32
    uv run --locked python scripts/generate.py --run_dir=runs/x --prompts_file=questions.txt \
        --output_file=answers.jsonl
    uv run --locked python scripts/generate.py --peft_dir=adapters/ --prompt="a gorgeous movie."

--run_dir is a run of --task=instruct, sst2_instruct or reviews_instruct (scripts/train.py's
--output_dir, or its <algorithm>/ folder when several algorithms were compared): its model is
rebuilt from the newest checkpoint (`runner.trained_run`). --peft_dir is a PEFT CAUSAL_LM
folder of scripts/export_adapters.py: the pretrained decoder its adapter_config.json names
(google/gemma-3-270m: --backbone=gemma3_270m) with the folder's LoRA adapters.

Prompts: --prompt (repeat it for several; each --input, repeated as often, is Alpaca's input of
the --prompt at its place, "" for none) or --prompts_file (one prompt per line; or rows of JSON
Lines, an Alpaca JSON list, CSV or TSV, prompted as training rows are, their answers printed as
references). A bare prompt is prompted as the run's training rows were: Alpaca's template for a
run on Alpaca rows, "Review: <prompt>\nSentiment:" for sst2_instruct / reviews_instruct, as
written for prompt/response rows (a PEFT folder: by the task its export.json records); --raw
gives the model the prompts as written. Each prompt's continuation (greedy, stopping at end of
text or after --max_new_tokens) is printed after the text the model read, one block per prompt;
--output_file writes them as JSON Lines (`prompt`, `continuation`, `reference`).
`runner.generation` does the work.

A bad flag, a folder that is no decoder run or CAUSAL_LM folder, a run without checkpoints, or
an empty prompt is one line on stderr and exit status 2.
"""

from __future__ import annotations

import dataclasses
import sys

from absl import app
from absl import flags

from runner import cli
from runner import generation

SCRIPT = "generate.py"


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This script's flags (defined when it runs, not on import: train.py's share names)."""
    where = {"flag_values": flag_values}
    flags.DEFINE_string("run_dir", None, "A training run's folder (scripts/train.py's "
                        "--output_dir; for several algorithms, its <algorithm>/ one) of an "
                        "instruction task.", **where)
    flags.DEFINE_string("peft_dir", None, "A PEFT CAUSAL_LM adapter folder "
                        "(scripts/export_adapters.py's --output_dir), instead of --run_dir.",
                        **where)
    flags.DEFINE_multi_string("prompt", None, "A prompt (repeat the flag for several).", **where)
    flags.DEFINE_multi_string("input", None, "Alpaca's input of the --prompt at the same place "
                              "(repeat it as often as --prompt; \"\" for none).", **where)
    flags.DEFINE_string("prompts_file", None, "A file of prompts: one per line, or rows of "
                        ".jsonl/.json/.csv/.tsv (Alpaca's instruction + input, or prompt).",
                        **where)
    flags.DEFINE_boolean("raw", False, "Give the model the prompts as written (no template).",
                         **where)
    flags.DEFINE_integer("max_new_tokens", 64, "The most tokens generated per prompt.", **where)
    flags.DEFINE_integer("batch_size", 8, "Prompts generated together.", **where)
    flags.DEFINE_string("output_file", None, "Also write the results there as JSON Lines.",
                        **where)
    flags.DEFINE_string("data_dir", None, "--data_dir the run was trained with (replaces the "
                        "recorded one).", **where)
    flags.DEFINE_string("frozen_dir", None, "--frozen_dir the run was trained with.", **where)


@dataclasses.dataclass(frozen=True)
class Request:
    """The checked flags: the folder (`run_dir` or `peft_dir`), prompts, options, output."""

    run_dir: str | None
    peft_dir: str | None
    prompts: generation.Prompts
    options: generation.GenerationOptions
    output_file: str | None


def checked(f: flags.FlagValues) -> Request:
    """The flags' request, or a `cli.UsageError` naming the flag (no TensorFlow needed)."""
    if (f.run_dir is None) == (f.peft_dir is None):
        raise cli.UsageError("give --run_dir=<training run folder> or --peft_dir=<PEFT adapter "
                             "folder>, one of the two")
    if (f.prompt is None) == (f.prompts_file is None):
        raise cli.UsageError("give the prompts as --prompt=<text> (repeatable) or "
                             "--prompts_file=<file>, one of the two")
    if f.input is not None and f.prompt is None:
        raise cli.UsageError("flag --input: Alpaca's input of a --prompt; a prompts file's rows "
                             "carry their own")
    if f.peft_dir is not None:
        for name in ("data_dir", "frozen_dir"):
            if f[name].present:
                raise cli.UsageError(f"flag --{name}: rebuilds a --run_dir's task; a PEFT "
                                     "folder has none")
    for name in ("max_new_tokens", "batch_size"):
        cli.at_least(name, f[name].value, 1)
    try:
        if f.prompt is not None:
            prompts = generation.Prompts(tuple(f.prompt), inputs=tuple(f.input or ()),
                                         as_written=f.raw)
        else:
            prompts = generation.read_prompts(f.prompts_file)
            if f.raw:
                prompts = dataclasses.replace(prompts, as_written=True)
    except (ValueError, FileNotFoundError) as e:
        flag = "--prompt" if f.prompt is not None else f"--prompts_file={f.prompts_file}"
        raise cli.UsageError(f"flag {flag}: {e}") from None
    options = generation.GenerationOptions(f.max_new_tokens, f.batch_size, f.data_dir,
                                           f.frozen_dir)
    return Request(f.run_dir, f.peft_dir, prompts, options, f.output_file)


# How the printed header names `Generations.style`.
STYLES = {"sentiment": "bare prompts as reviews (Review: <prompt>\\nSentiment:)",
          "alpaca": "bare prompts in Alpaca's template", "as_written": "prompts as given"}


def report(generations: generation.Generations, max_new_tokens: int) -> str:
    """What the script prints: a line naming the model and the prompting, then per prompt the
    text the model read and its continuation (and a file row's reference answer)."""
    n = len(generations.items)
    lines = [f"tffl: generating from {generations.source}; {STYLES[generations.style]}; "
             f"greedy, up to {max_new_tokens} new tokens"]
    for k, g in enumerate(generations.items, start=1):
        lines += [f"=== prompt {k}/{n} ===", g.prompt, f"=== continuation {k}/{n} ===",
                  g.continuation]
        if g.reference is not None:
            lines += [f"=== reference {k}/{n} ===", g.reference]
    return "\n".join(lines)


def main(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    if len(argv) > 1:
        return cli.error_exit(SCRIPT, cli.UsageError(
            f"unexpected arguments: {' '.join(argv[1:])} (flags are --name=value)"), 2)
    try:
        request = checked(flag_values)
    except cli.UsageError as e:
        return cli.error_exit(SCRIPT, e, 2)
    from models.checkpoints import CheckpointUnavailableError
    from tasks.run_task import counted

    cli.quiet_python_logs()
    try:
        if request.run_dir is not None:
            generations = generation.generate_from_run(request.run_dir, request.prompts,
                                                       request.options)
        else:
            generations = generation.generate_from_peft(request.peft_dir, request.prompts,
                                                        request.options)
    except (ValueError, FileNotFoundError) as e:
        return cli.error_exit(SCRIPT, e, 2)
    except CheckpointUnavailableError as e:   # the pretrained decoder could not be fetched
        return cli.error_exit(SCRIPT, e, 1)
    print(report(generations, request.options.max_new_tokens), flush=True)
    if request.output_file is not None:
        generation.write_json_lines(generations, request.output_file)
        print(f"tffl: wrote {counted(len(generations.items), 'generation')} to "
              f"{request.output_file}")
    return 0


def run_command_line(argv: list[str]) -> int:
    """`generate.py <argv[1:]>` in this process, with flags of its own (absl's global ones stay
    untouched); returns the exit status."""
    flag_values = flags.FlagValues()
    define_flags(flag_values)
    try:
        rest = flag_values(argv)
    except flags.Error as e:
        return cli.error_exit(SCRIPT, e, 2)
    return main(rest, flag_values)


def _parse_flags(argv: list[str]) -> list[str]:
    """absl parsing and the flag checks (a bad value: one line on stderr, exit status 2), then
    TensorFlow's import, before app.run's main (imported inside it, Keras could not build)."""
    import os
    import warnings

    from runner import tensorflow_import

    rest = cli.parse_flags(argv)
    try:
        checked(flags.FLAGS)
    except cli.UsageError as e:
        sys.exit(cli.error_exit(SCRIPT, e, 2))
    if not cli.verbosity_requested(argv[1:]):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        warnings.filterwarnings("ignore", message="pkg_resources is deprecated")
    tensorflow_import.import_tensorflow()
    return rest


if __name__ == "__main__":
    define_flags()
    app.run(main, flags_parser=_parse_flags)
