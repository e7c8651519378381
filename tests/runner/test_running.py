"""`runner.running`: an experiment's training runs (`run_training`: in this process, or
in a child fed a config file, which must not outlive the experiment), --estimate's probes and
the shared numeric helpers."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from runner import estimate, running
from runner.run_config import RunConfig

_CHILD = textwrap.dedent("""
    import os, pathlib, signal, sys, time
    out = pathlib.Path(sys.argv[1])
    def stopped(signum, frame):
        (out / "stopped").write_text(str(signum))
        sys.exit(0)
    signal.signal(signal.SIGTERM, stopped)
    (out / "pid").write_text(str(os.getpid()))
    time.sleep(120)
""")


def _wait_for(path: pathlib.Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_run_is_sent_sigterm_when_the_experiment_is_sigkilled(tmp_path):
    child = tmp_path / "child.py"
    child.write_text(_CHILD)
    parent = subprocess.Popen(
        [sys.executable, "-c", "import sys; from runner import running; "
         "running._run_command(sys.argv[1:], 'child')", str(child), str(tmp_path)],
        cwd=running.ROOT, stdout=subprocess.DEVNULL)
    try:
        assert _wait_for(tmp_path / "pid", 30), "the child did not start"
        parent.kill()   # no handler, no `finally`: only the kernel can tell the child
        parent.wait()
        assert _wait_for(tmp_path / "stopped", 10), "the child outlived its SIGKILLed parent"
        assert (tmp_path / "stopped").read_text() == str(int(signal.SIGTERM))
    finally:
        parent.kill()
        if (tmp_path / "pid").exists():
            try:
                os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_failed_run_is_one_step_error_naming_it(tmp_path):
    child = tmp_path / "fails.py"
    child.write_text("raise SystemExit(3)\n")
    with pytest.raises(running.StepError, match=r"^my run failed \(exit status 3\)$"):
        running._run_command([child], "my run")


def test_std_is_the_sample_std():
    """ddof = 1: (0.8, 0.9) → √((0.05² + 0.05²) / 1) = 0.0707107; (1, 2, 3, 4) → √(5/3) =
    1.2909944; one value has no std; missing values are left out."""
    assert running.sample_std([0.8, 0.9]) == pytest.approx(0.0707107, abs=1e-7)
    assert running.sample_std([1.0, 2.0, None, 3.0, 4.0]) == pytest.approx(1.2909944, abs=1e-7)
    assert running.sample_std([3.0]) != running.sample_std([3.0])   # NaN
    assert running.mean_std([0.8, 0.9], "{:.4f}") == "0.8500 ± 0.0707"


# One communication round of FedAvg-LoRA on digits, 2 clients of 2 local steps: the smallest run.
_ONE_ROUND = RunConfig().with_changes(algorithm=["fedavg_lora"], rounds=1, num_clients=2,
                                      clients_per_round=2, local_steps=2, eval_every=1)


def _check_finished(run_dir: pathlib.Path, config: RunConfig) -> None:
    """The run folder holds config.json (the run's configuration) and a finished summary."""
    assert RunConfig.from_json((run_dir / "config.json").read_text()) == config
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_completed"] == 1 and summary["algorithm"] == "fedavg_lora"
    assert "eval_accuracy" in summary["final"]


def test_a_training_run_goes_in_this_process(tmp_path, monkeypatch):
    """Not in a child: `_run_command`, which starts one, fails if called."""
    monkeypatch.setattr(running, "_run_command",
                        lambda *a: pytest.fail("a child process was started"))
    config = _ONE_ROUND.with_changes(output_dir=str(tmp_path / "run"))
    running.run_training(config, "one round")
    _check_finished(tmp_path / "run", config)


@pytest.mark.large
def test_an_isolated_training_run_goes_in_a_child_fed_its_config_file(tmp_path, monkeypatch):
    """`isolate`: `python -m runner.run <file>` runs the same configuration; the file is
    gone afterwards (the run folder's config.json stays)."""
    commands = []
    run_command = running._run_command
    monkeypatch.setattr(running, "_run_command",
                        lambda args, what: (commands.append(list(map(str, args))),
                                            run_command(args, what)))
    config = _ONE_ROUND.with_changes(output_dir=str(tmp_path / "run"))
    running.run_training(config, "one round", isolate=True)
    ((flag, module, path),) = commands
    assert (flag, module) == ("-m", "runner.run") and not pathlib.Path(path).exists()
    _check_finished(tmp_path / "run", config)


def test_a_failed_run_in_this_process_is_one_step_error_naming_it(tmp_path):
    config = RunConfig().with_changes(rounds=0, output_dir=str(tmp_path / "run"))
    with pytest.raises(running.StepError, match=r"^my run failed: .*--rounds=0") as error:
        running.run_training(config, "my run")
    assert "\n" not in str(error.value)


def test_estimate_probes_a_run_by_its_config(tmp_path, monkeypatch):
    """Under --estimate a run of 150 rounds evaluated every 5 becomes a 4-round probe evaluated
    every 2, not resumed, in <output_dir>/estimate; its Probe keeps the real run's 150 rounds
    and 30 evaluations and the probe's own round and evaluation seconds."""
    probed = []

    def fake_train(config, what, isolate):
        probed.append(config)
        folder = pathlib.Path(config.output.output_dir)
        folder.mkdir(parents=True)
        (folder / "metrics.csv").write_text(
            "round,round_seconds,evaluation_seconds\n1,5.0,\n2,1.0,3.0\n3,1.0,\n4,1.0,2.0\n")

    def runner(ctx):
        config = running.train_config(ctx, ctx.output_dir / "r", rounds=150, eval_every=5)
        running.run_training(config, "the run", ctx.isolate)

    monkeypatch.setattr(running, "_train", fake_train)
    ctx = running.Context("x", "small", tmp_path, resume=True, seed=3, data_dir=tmp_path,
                          log=lambda line: None)
    total = estimate.estimate_experiment(ctx, runner)
    # Probe.predicted_seconds: startup (wall ≈ 0) − 8 − 5 = −13, compile 5 − 1 = 4, first
    # evaluation extra 3 − 2 = 1, 150·1 + 30·2 = 210: 202 plus the probe's wall time.
    assert total == pytest.approx(202, abs=1)
    (config,) = probed
    assert (config.algorithm.rounds, config.output.eval_every, config.output.resume,
            config.algorithm.seed) == (4, 2, False, 3)
    assert config.output.output_dir == str(tmp_path / "estimate" / "r")
    assert estimate.active_probes() is None

