"""runner.run.build_runtime: the TFF runtime a run's configuration asks for."""

import pytest

from runner import run
from runner.run_config import RunConfig


@pytest.mark.parametrize("changes, expected", [
    ({"backbone": "gemma3_270m"}, "none"),      # a decoder: no Grappler pass by default
    ({"backbone": "gpt2_tiny"}, "none"),
    ({"backbone": "minilm"}, "tff"),            # an encoder: TFF's pass by default
    ({"backbone": "gemma3_270m", "graph_optimization": "tff"}, "tff"),   # the flag wins
    ({"backbone": "minilm", "graph_optimization": "none"}, "none"),
])
def test_local_and_remote_workers_get_the_models_graph_optimization(
        changes, expected, tmp_path, monkeypatch):
    from tffl import runtime

    seen = []
    monkeypatch.setattr(runtime, "local_runtime", lambda **kw: seen.append(kw["graph_optimization"]))
    monkeypatch.setattr(runtime, "remote_runtime",
                        lambda addresses, **kw: seen.append(kw["graph_optimization"]))
    config = RunConfig().with_changes(output_dir=str(tmp_path), **changes)
    run.build_runtime(config)
    run.build_runtime(config.with_changes(worker_addresses=("localhost:1",)))
    assert seen == [expected, expected]
