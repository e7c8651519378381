"""scripts/train.py's flag errors, in this process (`runner.train_flags`, which train.py
parses and checks with): one clear line naming the flag."""

import pytest
from absl import flags

from runner import train_flags
from runner import train_options
from runner.cli import UsageError


def _flag_values() -> flags.FlagValues:
    """train.py's flags, in a FlagValues of their own (absl's global ones stay untouched)."""
    flag_values = flags.FlagValues()
    train_flags.define(flag_values)
    return flag_values


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--algorithm=nope"], "--algorithm"),
        (["--output_dir=/proc/tffl_not_writable"], "--output_dir"),
        (["--resume"], "--resume"),
        (["--rank=65"], "--rank"),
    ],
)
def test_bad_flags_are_one_clear_line(args, flag, tmp_path, capsys):
    """train.py's parsing and checks (`train_flags.parse`, run before TensorFlow is imported), in
    this process: exit status, exactly one stderr line, no traceback."""
    if not any(a.startswith(("--output_dir", "--resume")) for a in args):
        args = [*args, f"--output_dir={tmp_path}"]  # never write runs/ into the checkout
    with pytest.raises(SystemExit) as exited:
        train_flags.parse(["train.py", *args], _flag_values())
    assert exited.value.code != 0
    stderr = capsys.readouterr().err
    err = stderr.strip().splitlines()
    assert len(err) == 1, stderr
    assert flag in err[0] and "Traceback" not in stderr
    if args[0] == "--algorithm=nope":
        assert "fedavg" in err[0] and "rolora" in err[0]  # the allowed values are named


# Checked by `train_options.check` (the code path above), each must fail with one line naming
# the flag.
_VALIDATED = [
    (["--num_clients=0"], "--num_clients"),
    (["--num_clients=4", "--clients_per_round=5"], "--clients_per_round"),
    (["--learning_rate=-1"], "--learning_rate"),
    (["--algorithm=rolora,rolora"], "--algorithm"),
    (["--rank=0"], "--rank"),
    (["--algorithm=fedrep", "--head_epochs=0"], "--head_epochs"),
    (["--algorithm=fedrep", "--representation_epochs=-2"], "--representation_epochs"),
    (["--participation=srpfl", "--stage_rounds=0"], "--stage_rounds"),
    (["--participation=srpfl", "--stage_rounds=ten"], "--stage_rounds"),
    (["--communication_cost=-1"], "--communication_cost"),
    (["--algorithm=fedavg", "--finetune_epochs=3"], "--finetune_epochs"),
    (["--algorithm=adaptpfl", "--shortcut_alpha=1.5"], "--shortcut_alpha"),
    (["--algorithm=adaptpfl", "--shortcut_alpha=-0.1"], "--shortcut_alpha"),
    (["--algorithm=adaptpfl", "--shortcut_damping=0.5"], "--shortcut_damping"),
    (["--algorithm=adaptpfl", "--adaptpfl_variant=b", "--head_damping=0"], "--head_damping"),
    (["--algorithm=adaptpfl", "--shortcut_ridge=-1"], "--shortcut_ridge"),
    (["--algorithm=fedrep", "--adaptpfl_variant=b"], "--adaptpfl_variant"),
    (["--algorithm=flute", "--flute_nc_penalty=-1"], "--flute_nc_penalty"),
    (["--algorithm=flute", "--flute_feature_penalty=-0.5"], "--flute_feature_penalty"),
    (["--algorithm=adaptpfl", "--representation=lora"], "--representation"),
    (["--lora_layers=a,b"], "--lora_layers"),
    (["--lora_alpha=0"], "--lora_alpha"),
    (["--task=sst2", "--algorithm=adaptpfl"], "--task"),
    (["--workers=0"], "--workers"),
    (["--worker_timeout=0"], "--worker_timeout"),
    (["--workers=2", "--worker_addresses=h:1"], "--workers"),
    (["--client_momentum=1.5"], "--client_momentum"),
    (["--client_optimizer=adam", "--client_momentum=0.5"], "--client_momentum"),
    (["--server_optimizer=adam", "--server_momentum=0.9"], "--server_momentum"),
    (["--weight_decay=-0.1"], "--weight_decay"),
    (["--server_learning_rate=0"], "--server_learning_rate"),
    (["--algorithm=fedsa_lora", "--representation=lora_alternating"], "--representation"),
    (["--participation=srpfl", "--num_clients=6", "--clients_per_round=6",
      "--initial_participants=7"], "--initial_participants"),
    (["--participation=srpfl", "--num_clients=10", "--srpfl_pool=11"], "--srpfl_pool"),
    (["--participation=uniform", "--srpfl_pool=2"], "--srpfl_pool"),
    (["--participation=srpfl", "--num_clients=10", "--srpfl_pool=4",
      "--initial_participants=5"], "--initial_participants"),
    (["--algorithm=flute", "--flute_variant=plain", "--head_epochs=3"], "--head_epochs"),
    (["--algorithm=fedper", "--representation_blocks=2"], "--representation_blocks"),
    (["--algorithm=fedrep", "--representation_blocks=0"], "--representation_blocks"),
    (["--client_optimizer=sgdm"], "--client_momentum"),
    (["--runtime=distribute", "--workers=2"], "--workers"),
    (["--devices=CPU:0"], "--devices"),
    (["--runtime=distribute", "--logical_cpus=-1"], "--logical_cpus"),
    (["--algorithm=rolora", "--client_ranks=2,4"], "--client_ranks"),
    (["--task=mnist", "--eval_test"], "--eval_test"),
    (["--algorithm=fedrep", "--flute_final_head_epochs=3"], "--flute_final_head_epochs"),
    (["--algorithm=flute", "--flute_final_head_epochs=-1"], "--flute_final_head_epochs"),
    (["--algorithm=flora", "--rank=4", "--client_ranks=2,8"], "--client_ranks"),
    (["--algorithm=flexlora", "--client_ranks=0,2"], "--client_ranks"),
    (["--algorithm=flexlora", "--client_ranks=a"], "--client_ranks"),
]
# Found while building the task (after the flags passed the checks), by
# `runner.training.run_algorithm`, unless the checks already refuse them (the first two:
# `train_options` makes the library's checks of --rank and --data_dir before TensorFlow).
_BUILD_ERRORS = [
    (["--algorithm=flora", "--client_ranks=2,65"], "--client_ranks"),
    (["--task=reviews", "--algorithm=fedrep"], "--data_dir"),
    (["--algorithm=fedrep", "--evaluate_only"], "--evaluate_only"),   # no checkpoint to evaluate
]


def test_flag_checks_name_the_flag(tmp_path):
    """Both lists, in this process."""
    from runner import training
    from runner.run_config import RunConfig

    for i, (args, flag) in enumerate(_VALIDATED + _BUILD_ERRORS):
        flag_values = _flag_values()
        try:
            flag_values(["train.py", *args, f"--output_dir={tmp_path / str(i)}"])
            options = train_flags.options(flag_values)
            train_options.check(options, train_flags.present(flag_values))
            output_dir = train_options.output_dir(options)
            if i >= len(_VALIDATED):
                config = RunConfig.from_flag_values(options)
                training.run_algorithm(options["algorithm"][0], output_dir, config)
            message = ""
        except (UsageError, flags.Error, ValueError) as e:
            message = str(e)
        assert flag in message and "\n" not in message, (args, message)

