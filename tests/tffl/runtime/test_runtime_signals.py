"""tffl.runtime: a SIGTERMed owner (`workers.sigterm_raises`) runs its cleanup once, a second
SIGTERM does not interrupt it, and the process exits although a thread never ends or the first
SIGTERM was swallowed. The owner that stops its workers on SIGTERM: test_runtime.py.

The owners are children forked from a Python that has imported TFF (tests/forked_python.py), not
`python -c` runs that would spend most of each test importing it."""

import signal
import textwrap

import pytest

from tests import forked_python


@pytest.fixture
def zygote() -> forked_python.Zygote:
    zygote = forked_python.start()
    zygote.wait_ready()
    return zygote


_BLOCKED_CHILD = textwrap.dedent(
    """
    import threading, time
    from tffl.runtime import workers

    workers.SIGTERM_EXIT_DEADLINE_S = 1.0
    with workers.sigterm_raises():
        # A library's non-daemon thread that never ends: Python's shutdown would join it forever.
        threading.Thread(target=threading.Event().wait).start()
        print("READY", flush=True)
        time.sleep(120)
    """
)


def _sigtermed(zygote, child: str, *second_after: str) -> tuple[int, str, str]:
    """Runs `child`; once it prints READY, SIGTERMs it, and, if `second_after` names the line it
    prints next, SIGTERMs it again after that line. Returns (status, stdout, stderr)."""
    proc = zygote.spawn(child)
    try:
        assert proc.stdout.readline().startswith("READY")
        proc.send_signal(signal.SIGTERM)
        for line in second_after:
            assert proc.stdout.readline().startswith(line)
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


@pytest.mark.large
def test_a_sigtermed_run_exits_although_a_thread_never_ends(zygote):
    status, _, err = _sigtermed(zygote, _BLOCKED_CHILD)
    assert status == 128 + signal.SIGTERM
    assert "still alive 1 s after SIGTERM" in err


_TWICE_TERMINATED_CHILD = textwrap.dedent(
    """
    import time
    from tffl.runtime import workers

    with workers.sigterm_raises():
        try:
            print("READY", flush=True)
            time.sleep(120)
        finally:
            print("STOPPING", flush=True)
            time.sleep(1.5)  # the cleanup (closing channels, stopping workers) takes a while
            print("CLEANED", flush=True)
    """
)


@pytest.mark.large
def test_a_second_sigterm_does_not_interrupt_the_cleanup(zygote):
    # A process manager and the parent-death signal can both send SIGTERM; the second one used
    # to raise inside the cleanup (inside gRPC's Channel.close, leaving a channel half-closed).
    status, out, err = _sigtermed(zygote, _TWICE_TERMINATED_CHILD, "STOPPING")
    assert "CLEANED" in out, err
    assert status == 128 + signal.SIGTERM
    assert "signal 15 again; already stopping" in err


_SWALLOWING_CHILD = textwrap.dedent(
    """
    import time
    from tffl.runtime import workers

    workers.SIGTERM_EXIT_DEADLINE_S = 1.0
    with workers.sigterm_raises():
        ready = False
        while True:
            try:
                if not ready:  # inside the try: a SIGTERM right after READY is swallowed too
                    ready = True
                    print("READY", flush=True)
                time.sleep(120)
            except BaseException:  # as a finalizer or a callback would swallow it
                print("SWALLOWED", flush=True)
    """
)


def test_a_second_sigterm_ends_a_run_that_swallowed_the_first(zygote):
    status, _, err = _sigtermed(zygote, _SWALLOWING_CHILD, "SWALLOWED")
    assert status == 128 + signal.SIGTERM
    assert "already stopping (exiting within 1 s)" in err
    assert "still alive 1 s after SIGTERM" in err

