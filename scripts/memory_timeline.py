"""A command's resident memory and CPU seconds, driver and TFF worker apart, per stage of its
progress lines (benchmarks/timeline.py), e.g. where a Gemma 3 run's memory and start-up go:

    uv run python scripts/memory_timeline.py --output_dir=/tmp/timeline -- \\
        .venv/bin/python scripts/train.py --task=sst2_instruct --backbone=gemma3_270m \\
        --algorithm=rolora --rounds=2 ...

Writes `samples.csv` (every reading) and `stages.md` (the table it prints) in --output_dir.
"""

import csv
import dataclasses
import pathlib

from absl import app, flags

from benchmarks.timeline import format_stages, run_timeline, stages

_INTERVAL = flags.DEFINE_float("interval", 0.5, "Seconds between two readings of /proc.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where samples.csv and stages.md go.",
                                  required=True)


def main(argv):
    command = argv[1:]
    if not command:
        raise app.UsageError("give the command to measure after --, e.g. -- python "
                             "scripts/train.py --task=sst2 ...")
    if _INTERVAL.value <= 0:
        raise app.UsageError(f"flag --interval={_INTERVAL.value}: pass a positive number of "
                             "seconds")
    try:
        status, samples, marks = run_timeline(command, _INTERVAL.value)
    except OSError as e:
        raise app.UsageError(f"cannot start {command[0]!r} ({e.strerror}); give the command "
                             "after -- as you would type it, e.g. .venv/bin/python "
                             "scripts/train.py ...") from None
    if not samples:
        print(f"{command[0]} exited (status {status}) before its first reading; nothing to "
              "tabulate")
        return status
    output = pathlib.Path(_OUTPUT_DIR.value)
    output.mkdir(parents=True, exist_ok=True)
    with open(output / "samples.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[x.name for x in dataclasses.fields(samples[0])])
        writer.writeheader()
        writer.writerows(dataclasses.asdict(s) for s in samples)
    table = format_stages(stages(samples, marks))
    (output / "stages.md").write_text(table + "\n")
    print(table)
    return status


if __name__ == "__main__":
    app.run(main)
