"""scripts/reproduce.py: bad flags are one line (exit 2, checked in this process by
`reproduce.parse`), the shared table/plot writer, and one small-scale row re-run and compared
with the number recorded in docs/REPRODUCE.md. Only the --collect smoke test runs the script in a
subprocess (for one of its two experiments)."""

import csv
import math
import pathlib
import sys

import pytest

from experiments import rolora_linear, srpfl, sst2_protocol
from runner import estimate, report, running
from runner.run_config import RunConfig
from scripts import reproduce
from tests import forked_python

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "reproduce.py"
DOC = ROOT / "docs" / "REPRODUCE.md"


def _run(*args, timeout=120):
    return forked_python.run_script(SCRIPT, *args, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize(
    "args, flag",
    [
        ([], "--experiment"),
        (["--experiment=nope"], "--experiment"),
        (["--experiment=rolora_linear", "--scale=huge"], "--scale"),
        (["--experiment=rolora_linear", "--seed=-1"], "--seed"),
        (["--experiment=rolora_linear", "--seed=one"], "--seed"),
        (["--experiment=rolora_linear", "--output_dir=/proc/tffl_not_writable"], "--output_dir"),
        (["--experiment=rolora_mnist", "--data_dir=/nonexistent/tffl_data"], "--data_dir"),
        (["--experiment=rolora_linear", "extra"], "unexpected arguments"),
        (["--experiment=srpfl_mnist", "--collect"], "--collect"),
        (["--experiment=rolora_linear", "--estimate"], "--estimate"),
        (["--experiment=flute_synthetic", "--estimate"], "--estimate"),
        (["--experiment=sst2_clients", "--methods=rolora,nope"], "--methods"),
        (["--experiment=sst2_dirichlet", "--methods=centralized"], "--methods"),
        (["--experiment=sst2_dirichlet_mean", "--methods=ffa_lora"], "--methods"),
        (["--experiment=sst2_clients_mean", "--methods=flora"], "--methods"),
        (["--experiment=srpfl_mnist", "--methods=rolora"], "--methods"),
        (["--experiment=rolora_linear", "--archive_dir=/tmp"], "--archive_dir"),
        (["--experiment=sst2_clients", "--archive_dir=/proc/tffl_not_writable"],
         "--archive_dir"),
        (["--experiment=sst2_clients", "--output_dir=/tmp/tffl_same_dir",
          "--archive_dir=/tmp/tffl_same_dir"], "--archive_dir"),
        (["--experiment=sst2_clients", "--output_dir=/tmp/tffl_same_dir/out",
          "--archive_dir=/tmp/tffl_same_dir"], "--archive_dir"),
    ],
)
def test_bad_flags_are_one_clear_line(args, flag, tmp_path, capsys, monkeypatch):
    if args and not any(a.startswith("--output_dir") for a in args):
        args = [*args, f"--output_dir={tmp_path / 'out'}"]
    line, stderr = _refused(args, capsys, monkeypatch)
    assert flag in line and "Traceback" not in stderr


def _refused(args: list[str], capsys, monkeypatch) -> tuple[str, str]:
    """The one stderr line (and all of stderr) of `reproduce.py <args>`, which must exit with
    status 2: from the flag check (`reproduce.parse`) or, for flags that pass it (a missing
    --data_dir), from `reproduce.main`, whose experiment checks its data before anything runs
    (here without its SIGTERM handler and log settings, which are for the command line)."""
    with pytest.raises(SystemExit) as exited:
        reproduce.parse(["reproduce.py", *args])
        monkeypatch.setattr(reproduce, "_quiet", lambda: None)
        monkeypatch.setattr(reproduce.signal, "signal", lambda *_: None)
        sys.exit(reproduce.main(["reproduce.py"]))
    stderr = capsys.readouterr().err
    assert exited.value.code == 2, stderr
    err = stderr.strip().splitlines()
    assert len(err) == 1, stderr
    return err[0], stderr


def test_a_used_output_dir_needs_resume(tmp_path, capsys, monkeypatch):
    (tmp_path / "results.md").write_text("an earlier run")
    line, stderr = _refused(["--experiment=rolora_linear", f"--output_dir={tmp_path}"], capsys,
                            monkeypatch)
    assert "--output_dir" in stderr and "--resume" in stderr


def test_good_flags_give_one_context_per_experiment(tmp_path):
    reproduce.parse(["reproduce.py", "--experiment=rolora_linear", "--seed=3",
                     f"--output_dir={tmp_path / 'out'}"])
    assert [(c.experiment, c.seed, c.output_dir) for c in reproduce._CONTEXTS] == [
        ("rolora_linear", 3, tmp_path / "out")]


def test_writer_produces_csv_markdown_and_png(tmp_path):
    table = report.Table(
        title="A title.",
        columns=[report.Column("name", "name"),
                 report.Column("value", "value", "{:.3f}"),
                 report.Column("note", "note", lambda v: v.upper())],
        rows=[{"name": "a", "value": 0.5, "note": "x|y"},
              {"name": "b", "value": math.nan, "note": None}],
        notes=["A note."],
    )
    text = report.write_table(tmp_path, table)
    assert text == (tmp_path / "results.md").read_text().rstrip("\n")
    assert text.startswith("A title.\n\n| name | value | note |\n|---|---|---|\n")
    assert "| a | 0.500 | X\\|Y |" in text          # a pipe inside a cell is escaped
    assert "| b | – | – |" in text                  # NaN and None print as a dash
    assert text.endswith("\n\nA note.")
    with open(tmp_path / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows == [{"name": "a", "value": "0.5", "note": "x|y"},
                    {"name": "b", "value": "nan", "note": ""}]

    panels = [
        report.Panel("lines", "round", "error",
                        [report.Series("one", [0, 1, 2], [1.0, 0.1, None])],
                        logy=True, hlines=[("floor", 0.05)]),
        report.Panel("bars", "", "speedup",
                        [report.Series("N = 1", [], [1.0, 2.0]),
                         report.Series("N = 2", [], [1.5, math.nan])],
                        kind="bar", categories=["C = 0", "C = 1"]),
    ]
    report.save_plot(tmp_path / "results.png", panels, "title")
    png = (tmp_path / "results.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_units_are_reloaded_only_when_resuming(tmp_path):
    ctx = running.Context("rolora_linear", "small", tmp_path, resume=False, seed=0,
                            data_dir=tmp_path)
    running.save_unit(ctx, "u", {"sin_theta": [1.0, 0.5]})
    assert running.load_unit(ctx, "u") is None
    resumed = running.Context("rolora_linear", "small", tmp_path, resume=True, seed=0,
                                data_dir=tmp_path)
    assert running.load_unit(resumed, "u") == {"sin_theta": [1.0, 0.5]}
    assert running.load_unit(resumed, "missing") is None


def test_sst2_rounds_keep_the_sample_budget():
    # The paper's schedule (rolora.md §3.1): 500 rounds for 3 clients -> 75 (20) -> 30 (50).
    assert [sst2_protocol.sst2_rounds(500, n) for n in (3, 20, 50)] == [500, 75, 30]
    assert [sst2_protocol.sst2_rounds(10, n) for n in (3, 20, 50)] == [10, 2, 1]
    assert sst2_protocol.sst2_rounds(1, 1000) == 1


def _doc_rows(section: str, header_cell: str) -> tuple[list[str], list[list[str]]]:
    """The first Markdown table after `section` (a heading) whose header has `header_cell`."""
    text = DOC.read_text()
    start = text.index(section)
    end = text.find("\n## ", start + len(section))
    lines = text[start:end if end >= 0 else None].splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and header_cell in cells:
            body = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                body.append([c.strip() for c in row.strip().strip("|").split("|")])
            return cells, body
    raise AssertionError(f"no table with {header_cell!r} under {section!r} in {DOC}")


@pytest.mark.large
def test_small_linear_row_matches_docs(tff_runtime):
    """Re-runs the rolora_linear small-scale row (heterogeneous, RoLoRA, seed 0) and compares
    its final sin θ and loss with docs/REPRODUCE.md."""
    header, body = _doc_rows("## 1. rolora_linear", "final sin θ")
    row = next(r for r in body if r[:2] == ["heterogeneous", "RoLoRA"])
    recorded_angle = float(row[header.index("final sin θ")])
    recorded_loss = float(row[header.index("final global loss")])

    config = rolora_linear.LINEAR_SCALES["small"]
    processes = rolora_linear.lora_processes(config, methods=("rolora",))
    unit = rolora_linear.linear_unit(config, processes, "heterogeneous", "rolora", seed=0)
    assert unit["communication_rounds"] == config.rounds
    angle, loss = unit["sin_theta"][config.rounds], unit["loss"][config.rounds]
    print(f"final sin θ {angle:.4g} (docs {recorded_angle}), loss {loss:.5g} "
          f"(docs {recorded_loss})")
    # The docs print 3 (angle) and 6 (loss) significant digits; float32 round-off is far below.
    assert angle == pytest.approx(recorded_angle, rel=1e-2)
    assert loss == pytest.approx(recorded_loss, rel=1e-4)


def test_time_to_target_is_the_first_evaluated_round_at_or_above_it():
    rows = [{"round": "5", "simulated_time": "3.0", "eval_personal_accuracy": "0.80"},
            {"round": "6", "simulated_time": "4.0", "eval_personal_accuracy": ""},
            {"round": "10", "simulated_time": "9.5", "eval_personal_accuracy": "0.95"},
            {"round": "15", "simulated_time": "12.0", "eval_personal_accuracy": "0.97"}]
    assert srpfl.time_to_target(rows, 0.95) == (9.5, 10)
    assert srpfl.time_to_target(rows, 0.8) == (3.0, 5)
    assert srpfl.time_to_target(rows, 0.99) is None
    # Both methods share every training field but the participation ones.
    shared = srpfl.srpfl_mnist_fields(150)
    assert shared["srpfl_pool"] == 20 and shared["straggler"] == "fixed"
    assert srpfl.srpfl_mnist_fields(150, "dynamic")["straggler"] == "dynamic"
    assert not any(name.startswith("participation") for name in shared)


def test_estimate_probe_arithmetic():
    """A probe of 4 rounds (1st: 5 s with compile, then 1 s each) and 2 evaluations (3 s, then
    2 s) in 20 s of wall time predicts, for 150 rounds and 30 evaluations:
    startup 20 − 8 − 5 = 7, compile 5 − 1 = 4, first evaluation extra 1, 150·1 + 30·2 = 210."""
    probe = estimate.Probe("x", 150, 30, 20.0, [5.0, 1.0, 1.0, 1.0], [3.0, 2.0])
    assert probe.predicted_seconds() == pytest.approx(7 + 4 + 1 + 150 + 60)
    config = RunConfig().with_changes(rounds=150, eval_every=5, output_dir="d", resume=True)
    probe, rounds, evaluations = estimate.probe_config(config)
    assert (rounds, evaluations) == (150, 30)
    assert probe == config.with_changes(rounds=4, eval_every=2, resume=False)
    assert estimate.probe_config(config.with_changes(rounds=7))[1:] == (7, 2)


def test_sst2_protocol_runs_share_the_sample_budget_and_report_held_out_accuracy(tmp_path):
    """Every SST-2 claim run evaluates on the labeled test split; R_N keeps R_3·3 client-rounds;
    FedSA-LoRA's personalized accuracy is a dev figure, never passed off as a test one."""
    cfg = sst2_protocol.SST2_CLAIM_SCALES["full"]
    run = sst2_protocol.Sst2Run("rolora_ffa", 50, 2, 0.3,
                                sst2_protocol.sst2_rounds(cfg["rounds_3"], 50), tmp_path / "r")
    config = sst2_protocol.sst2_claim_config(cfg, run, {"partition": "iid"}, "/d")
    assert config.output.eval_test and config.algorithm.rounds == 30
    assert config.algorithm.rolora_fraction == 0.2
    assert config.task.num_clients == 50 and config.participation.clients_per_round == 50
    central = sst2_protocol.Sst2Run("centralized", 1, 0, 0.3, cfg["rounds_3"], tmp_path / "c")
    config = sst2_protocol.sst2_claim_config(cfg, central, {"partition": "iid"}, "/d")
    assert config.algorithm.algorithm == ("fedavg_lora",) and config.task.num_clients == 1
    assert config.algorithm.rounds == cfg["rounds_3"]
    # The frozen-pooler protocol, stated in the configuration: the pooler, 32 tokens, no head.
    assert config.model.pooling == "pooler" and config.task.sequence_length == 32
    assert "head" not in config.changed()
    personal = {"final": {"eval_personal_accuracy": 0.8}}
    assert sst2_protocol.claim_accuracy(personal, "eval_accuracy") == 0.8
    assert sst2_protocol.claim_accuracy(personal, "eval_test_accuracy") is None
    both = {"final": {"eval_accuracy": 0.7, "eval_test_accuracy": 0.75}}
    assert sst2_protocol.claim_accuracy(both, "eval_test_accuracy") == 0.75
    assert sst2_protocol.run_finished(run) is None


@pytest.mark.parametrize("experiment", ["sst2_clients_mean", "sst2_dirichlet_mean"])
def test_the_mean_experiments_collect_their_tables_and_claims(experiment, tmp_path, capsys,
                                                              monkeypatch):
    """--collect on the issue-51 experiments with nothing run yet: every cell 0 seeds, every
    claim undecided; the tables say which classifier they are about. The first runs the script
    in a subprocess (the command line's smoke test), the second `reproduce.main` in this process
    (as `_refused` runs it), sparing a second interpreter's TensorFlow import."""
    (tmp_path / "sst2").mkdir()
    for split in ("train", "dev", "test-labeled"):
        (tmp_path / "sst2" / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"w {i}\t{i % 2}\n" for i in range(40)))
    args = [f"--experiment={experiment}", "--collect", f"--data_dir={tmp_path}",
            f"--output_dir={tmp_path / 'out'}"]
    if experiment == "sst2_clients_mean":
        proc = _run(*args)
        assert proc.returncode == 0, proc.stderr
    else:
        reproduce.parse(["reproduce.py", *args])
        monkeypatch.setattr(reproduce, "_quiet", lambda: None)
        monkeypatch.setattr(reproduce.signal, "signal", lambda *_: None)
        assert reproduce.main(["reproduce.py"]) == 0, capsys.readouterr().err
    results = (tmp_path / "out" / "results.md").read_text()
    assert "corrected classifier: mean pooling, linear head, whole sentences" in results
    claims = (tmp_path / "out" / "claims.md").read_text()
    assert "undecided (0 seeds)" in claims and "5 steps × batch 16 = 80 samples" in claims
