"""Every ```python block of README.md and docs/*.md runs as written.

Each block runs as `python example.py` would (the uv environment's Python), in a temporary working
directory, with the repository on `PYTHONPATH`, and must exit with status 0 within the timeout: a
child forked from a Python that has imported TensorFlow, TFF and KerasNLP but run no op
(tests/forked_python.py), so that each block does not spend 10-20 s importing them again.
As the docs' commands do from the checkout's root, a block reads the shared data as
`../shared/data`: the working directory has that folder beside it (a link to the one beside the
checkout); a block that names it is skipped, with the reason, where the folder is absent.
HTML comments right above a block's fence (blank lines between are allowed) say more:

- `<!-- docs-example: skip (reason) -->`: the block is not run; the test reports a skip with the
  reason (for blocks that need data this checkout does not have, a download, or hours, and for a
  block another test already runs as written, in-process, checking at least as much);
- `<!-- docs-example: prints TEXT -->`: what the block prints; its output must contain TEXT;
- `<!-- docs-example: continues -->`: the block goes on from the file's previous block (its
  names are that block's), so it runs after that block's code, in the same process.

A block and the blocks that continue it run as one program, once: after each block's code it
prints a line marking that block's end. A block passes when its end is reached (for the last
block of the program, when the program also exits with status 0), and what it prints is looked
for between the previous block's end and its own.

Any other `docs-example:` comment is an error, so a typo cannot silently turn a check off.
The examples train small models on the TFF worker, several seconds each, so they run in the
`large` tier; the parsing of the markers is checked in the fast tier.
"""

import dataclasses
import os
import pathlib
import re
import subprocess
import textwrap

import pytest

from tests import forked_python

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT_S = 600

_FENCE = re.compile(r"^(\s*)```python\s*$")
_CLOSE = re.compile(r"^\s*```\s*$")
_COMMENT = re.compile(r"^\s*<!--\s*docs-example:(.*?)-->\s*$")
_MARKER = re.compile(r"^\s*(?:skip\s+\((?P<reason>.+)\)|prints\s+(?P<prints>\S.*?)|"
                     r"(?P<continues>continues))\s*$")


@dataclasses.dataclass(frozen=True)
class Example:
    """One ```python block: where it is (`path:line`, the fence's line), its code and markers."""

    path: str
    line: int
    code: str
    skip: str | None = None
    prints: tuple[str, ...] = ()
    continues: bool = False

    @property
    def name(self) -> str:
        return f"{self.path}:{self.line}"


def _markers(lines: list[str], fence: int, where: str) -> dict:
    """The markers of the block whose fence is `lines[fence]`: the comments above it."""
    found = dict(skip=None, prints=(), continues=False)
    i = fence - 1
    while i >= 0 and (not lines[i].strip() or _COMMENT.match(lines[i])):
        comment = _COMMENT.match(lines[i])
        if comment:
            marker = _MARKER.match(comment.group(1))
            if marker is None:
                raise ValueError(f"{where}:{i + 1}: unknown docs-example marker "
                                 f"{comment.group(1).strip()!r}: use skip (reason), prints "
                                 "TEXT or continues")
            if marker.group("reason"):
                found["skip"] = marker.group("reason").strip()
            elif marker.group("prints"):
                found["prints"] = (marker.group("prints"), *found["prints"])
            else:
                found["continues"] = True
        i -= 1
    return found


def examples(path: pathlib.Path) -> list[Example]:
    """The ```python blocks of one markdown file, in order."""
    lines = path.read_text().splitlines()
    where = str(path.relative_to(ROOT))
    found, i = [], 0
    while i < len(lines):
        if _FENCE.match(lines[i]):
            end = i + 1
            while end < len(lines) and not _CLOSE.match(lines[end]):
                end += 1
            if end == len(lines):
                raise ValueError(f"{where}:{i + 1}: the ```python block is never closed")
            code = textwrap.dedent("\n".join(lines[i + 1:end])) + "\n"
            found.append(Example(where, i + 1, code, **_markers(lines, i, where)))
            i = end
        i += 1
    for first, example in zip(found, found[1:]):
        if example.continues and first.skip and not example.skip:
            raise ValueError(f"{example.name} continues {first.name}, which is skipped")
    if found and found[0].continues:
        raise ValueError(f"{found[0].name} continues, but no block comes before it")
    return found


def _all_examples() -> list[Example]:
    return [e for path in DOCUMENTS for e in examples(path)]


def _program(example: Example, previous: list[Example]) -> str:
    """The code that runs: the chain of blocks `example` continues, then `example`'s own."""
    return "".join(e.code for e in _chain(example, previous))


def _chain(example: Example, previous: list[Example]) -> list[Example]:
    """The blocks `example` continues (back to the first that does not continue), then it."""
    chain = [example]
    for earlier in reversed(previous):
        if not chain[0].continues:
            break
        chain.insert(0, earlier)
    return chain


def test_the_docs_examples_are_found_and_their_markers_are_well_formed():
    found = _all_examples()
    assert len(found) >= 12
    assert {e.path for e in found} >= {"README.md", "docs/engine.md", "docs/personalization.md",
                                       "docs/runtime.md", "docs/tasks.md"}
    for e in found:
        compile(_program(e, [p for p in found if p.path == e.path and p.line < e.line]),
                e.name, "exec")   # every block (after the ones it continues) is Python
        assert e.skip is None or len(e.skip) > 10, f"{e.name}: say why it is skipped"

    sample = ["text", "<!-- docs-example: prints 7 -->", "", "<!-- docs-example: continues -->",
              "```python", "print(3 + 4)", "```"]
    assert _markers(sample, 4, "sample") == dict(skip=None, prints=("7",), continues=True)
    with pytest.raises(ValueError, match="sample:1: unknown docs-example marker 'skip'"):
        _markers(["<!-- docs-example: skip -->", "```python"], 1, "sample")


def _params():
    """Each block with the blocks of its file before it, and those after it that continue it."""
    found = _all_examples()
    params = []
    for i, e in enumerate(found):
        following = []
        for later in found[i + 1:]:
            if later.path != e.path or not later.continues:
                break
            following.append(later)
        params.append(pytest.param(
            e, [p for p in found if p.path == e.path and p.line < e.line], following,
            id=e.name, marks=pytest.mark.large))
    return params


def _end_marker(example: Example) -> str:
    return f"<docs-example end of {example.name}>"


# The program of each chain of blocks, run once: its first block's name -> (status, stdout,
# stderr, names of the blocks it ran).
_RUNS: dict[str, tuple[int | None, str, str, list[str]]] = {}


def _run_chain(chain: list[Example], tmp_path_factory) -> tuple[int | None, str, str, list[str]]:
    """Runs `chain` as one program (each block's code, then a line marking its end) in a fresh
    working directory, once per chain."""
    key = chain[0].name
    if key not in _RUNS:
        tmp_path = tmp_path_factory.mktemp("docs_example")
        shared = ROOT.parent / "shared"
        workdir = tmp_path / "work"
        workdir.mkdir()
        if shared.is_dir():
            (tmp_path / "shared").symlink_to(shared)
        script = tmp_path / "example.py"
        script.write_text("".join(
            f"{e.code}print({_end_marker(e)!r}, flush=True)\n" for e in chain))
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        try:
            done = forked_python.run_script(script, cwd=workdir, env=env, timeout=TIMEOUT_S)
            _RUNS[key] = (done.returncode, done.stdout, done.stderr, [e.name for e in chain])
        except subprocess.TimeoutExpired:
            _RUNS[key] = (None, "", "", [e.name for e in chain])
    return _RUNS[key]


@pytest.mark.parametrize("example, previous, following", _params())
def test_the_docs_example_runs_as_written(example, previous, following, tmp_path_factory):
    if example.skip:
        pytest.skip(f"{example.name}: {example.skip}")
    shared = ROOT.parent / "shared"
    if "../shared" in _program(example, previous) and not shared.is_dir():
        pytest.skip(f"{example.name} reads {shared}, which is absent")
    # The program: the blocks it continues, it, and the blocks that continue it (up to one that
    # is skipped or, where the shared data is absent, reads it).
    chain = _chain(example, previous)
    for later in following:
        if later.skip or ("../shared" in later.code and not shared.is_dir()):
            break
        chain.append(later)
    status, stdout, stderr, ran = _run_chain(chain, tmp_path_factory)
    assert ran == [e.name for e in chain]
    if status is None:
        pytest.fail(f"{example.name} did not finish within {TIMEOUT_S} s")
    index = chain.index(example)
    reached = _end_marker(example) in stdout
    if not reached or example is chain[-1]:
        assert status == 0, f"{example.name} exited with {status}:\n{stderr[-4000:]}"
    assert reached, f"{example.name}: its end was not reached:\n{stdout[-2000:]}"
    own = stdout.split(_end_marker(example))[0]
    if index > 0:
        own = own.split(_end_marker(chain[index - 1]))[-1]
    for text in example.prints:
        assert text in own, f"{example.name} should print {text!r}; it printed:\n" + (
            own[-2000:])
