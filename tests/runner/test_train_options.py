"""runner.train_options: scripts/train.py's flags checked together, without absl.

The whole program's one-line errors are tested in tests/scripts/test_train_flags.py and test_train_runs.py; here, the checks
that depend on which flags were given, and that DEFAULTS are train.py's own flag defaults.
"""

import pathlib

import pytest

from runner import train_options
from runner.cli import UsageError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _options(**changes):
    return dict(train_options.DEFAULTS, **changes)


def test_the_defaults_pass():
    train_options.check(_options())


@pytest.mark.parametrize("changes, present, flag", [
    ({"adaptpfl_variant": "b"}, {"adaptpfl_variant"}, "--adaptpfl_variant=b"),  # not adaptpfl
    ({"algorithm": ["flute"], "flute_variant": "plain"}, {"head_epochs"}, "--head_epochs=10"),
])
def test_a_flag_given_where_it_does_nothing_is_refused(changes, present, flag):
    """Given on the command line, refused (AdaptPFL's switch without adaptpfl; head-only epochs
    for plain FLUTE, which has none); the same values not given pass."""
    with pytest.raises(UsageError, match=flag):
        train_options.check(_options(**changes), present)
    train_options.check(_options(**changes), present=())


@pytest.mark.parametrize("changes, message", [
    ({"clients_per_round": 6}, "flag --clients_per_round=6: must be <= --num_clients=5"),
    ({"rank": 4, "rank_present": True, "client_ranks": ["2", "8"], "algorithm": ["flora"]},
     "flag --client_ranks=2,8: rank 8 is above --rank=4"),
    ({"algorithm": ["srpfl_nope"]}, "flag --algorithm=srpfl_nope: unknown srpfl_nope"),
    ({"algorithm": ["fedavg", "fedavg"]}, "flag --algorithm=fedavg,fedavg: names repeat"),
    ({"participation": "srpfl", "srpfl_pool": 3, "initial_participants": 4},
     "flag --initial_participants=4: must be <= --srpfl_pool=3"),
    ({"client_optimizer": "adam", "client_momentum": 0.9},
     "flag --client_momentum=0.9: momentum applies to the sgd and sgdm optimizers only"),
    ({"runtime": "distribute", "workers": 2}, "flags --workers/--worker_addresses are for"),
    ({"eval_test": True}, "flag --eval_test: only --task=sst2"),
])
def test_a_value_that_cannot_work_is_named(changes, message):
    with pytest.raises(UsageError) as raised:
        train_options.check(_options(**changes))
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_client_ranks_without_rank_take_the_largest():
    train_options.check(_options(algorithm=["flexlora"], client_ranks=["2", "32"]))
    with pytest.raises(UsageError, match="rank 32 is above --rank=16"):
        train_options.check(_options(algorithm=["flexlora"], client_ranks=["2", "32"],
                                     rank_present=True))


def test_output_dir(tmp_path, monkeypatch):
    assert train_options.output_dir(_options(output_dir=str(tmp_path / "a"))) == tmp_path / "a"
    assert (tmp_path / "a").is_dir()
    with pytest.raises(UsageError, match="flag --resume needs --output_dir"):
        train_options.output_dir(_options(resume=True))
    with pytest.raises(UsageError, match="flag --evaluate_only needs --output_dir naming the run"):
        train_options.output_dir(_options(evaluate_only=True))
    monkeypatch.chdir(tmp_path)
    made = train_options.output_dir(_options(algorithm=["rolora", "fedavg_lora"], task="mnist"))
    assert made.parent == pathlib.Path("runs") and made.name.startswith("mnist-rolora-fedavg_lora-")
    made = train_options.output_dir(_options(algorithm=["a", "b", "c", "d"]))
    assert made.name.startswith("digits-compare-")
