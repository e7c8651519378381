"""tests/durations.py: the recorded seconds per file and tier, and the longest-first order."""

import json
import math
import types

from tests import durations


def _report(nodeid, duration, large=False):
    return types.SimpleNamespace(nodeid=nodeid, duration=duration,
                                 keywords={"large": 1} if large else {"test": 1})


def test_record_sums_phases_per_file_and_tier_and_keeps_what_did_not_run(tmp_path):
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"a.py": [1.0, 2.0], "old.py": [3.0, 4.0]}))
    durations.record([_report("a.py::t1", 0.25), _report("a.py::t1", 1.0),
                      _report("a.py::t2", 5.0, large=True), _report("b.py::t", 2.0)], path)
    assert json.loads(path.read_text()) == {
        "a.py": [1.2, 5.0], "b.py": [2.0, 0.0], "old.py": [3.0, 4.0]}
    # A fast-tier run replaces the fast seconds only.
    durations.record([_report("a.py::t1", 0.5)], path)
    assert json.loads(path.read_text())["a.py"] == [0.5, 5.0]


def test_order_puts_unknown_then_longest_files_first_and_keeps_each_file_together():
    items = [types.SimpleNamespace(nodeid=n, keywords={"large": 1} if "big" in n else {})
             for n in ["s.py::1", "l.py::1", "l.py::big", "s.py::2", "u.py::1", "m.py::1"]]
    record = {"s.py": [1.0, 0.0], "l.py": [2.0, 100.0], "m.py": [50.0, 0.0]}
    durations.order(items, record)
    assert [i.nodeid for i in items] == [
        "u.py::1", "l.py::1", "l.py::big", "m.py::1", "s.py::1", "s.py::2"]
    assert durations.file_seconds("l.py", {"fast"}, record) == 2.0
    assert durations.file_seconds("x.py", {"fast"}, record) == math.inf
