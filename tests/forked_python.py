"""Python children forked from one that has already imported TensorFlow, TFF and `tffl.runtime`.

The owner-process tests of tests/tffl/runtime/ and the scripts' smoke tests of tests/scripts/ run
their program as a child: as `python -c CODE` or `python scripts/x.py` it would spend 20-40 s of a
loaded two-core machine (10 s of a quiet core) importing TensorFlow, TFF and KerasNLP before doing
what the test is about (start workers, take a signal, train, print, exit). `spawn(CODE)` forks it
instead from the zygote: one Python per test process, started by `start()` (the import then
overlaps other tests) or on first use, that imports `PRELOAD` and then only forks. It has run no
TensorFlow op and opened no gRPC channel, so a child starts both afresh, as a new process does.
`run_script` and `popen_script` are `subprocess.run` and `subprocess.Popen` of `python SCRIPT ARGS`
on it. What a child cannot change is what its modules read when the zygote imported them
(TF_CPP_MIN_LOG_LEVEL, CUDA_VISIBLE_DEVICES, ...): a test about those starts a new Python.

A child runs CODE as `__main__` with the test's pipes as its stdin, stdout and stderr and SIGINT
raising KeyboardInterrupt (as a Python started from a shell does), and exits as `python -c CODE`
does: it is the zygote's interpreter leaving its main module (an uncaught exception's traceback
and status 1, `SystemExit`'s status, an uncaught KeyboardInterrupt re-raised as SIGINT,
non-daemon threads joined, `atexit` hooks run). `spawn` returns a `Child`, the part of
`subprocess.Popen`'s interface the tests use.

    python tests/tffl/runtime/forked_python.py FD   # the zygote, serving on the socket FD
"""

from __future__ import annotations

import atexit
import builtins
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

PRELOAD = ("numpy", "psutil", "tensorflow_federated", "tffl.runtime", "keras_nlp",
           "tensorflow_datasets", "matplotlib.pyplot")
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READY_TIMEOUT_S = 900.0  # the zygote's imports, on a loaded machine
_POLL_S = 0.05


# --- the zygote's side ---------------------------------------------------------------------------

def _report_exits(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def _serve(sock: socket.socket) -> dict:
    """Forks a child for each request and reports its pid, then its exit status; returns the
    request in the child. Exits when the test process closes the socket."""
    sock.send(json.dumps({"ready": os.getpid()}).encode())
    while True:
        _report_exits(sock)
        if not select.select([sock], [], [], _POLL_S)[0]:
            continue
        message, fds, _, _ = socket.recv_fds(sock, 1 << 16, 3)
        if not message:
            sys.exit(0)
        pid = os.fork()
        if pid == 0:
            sock.close()
            for target, fd in enumerate(fds):  # stdin, stdout, stderr
                os.dup2(fd, target)
                os.close(fd)
            return json.loads(message)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())


def _zygote_main(fd: int) -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    request = _serve(socket.socket(fileno=fd))
    # From here on, a child.
    sys.argv = ["-c", *request["args"]]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    exec(compile(request["code"], "<string>", "exec"),
         {"__name__": "__main__", "__builtins__": builtins})


# --- the test process's side ---------------------------------------------------------------------

class Zygote:
    """The zygote process and its socket; `spawn` forks a child from it."""

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        self._log = tempfile.TemporaryFile()
        # The checkout first on the zygote's path, as it is on the test process's (pytest's
        # rootdir): the children import this checkout's packages, whatever the environment's
        # editable install points to.
        path = os.pathsep.join(filter(None, [_CHECKOUT, os.environ.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno())], pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=path))
        theirs.close()
        self._exits: dict[int, int] = {}
        self._lock = threading.Lock()
        self._ready = False

    def _receive(self, timeout_s: float) -> dict | None:
        """The zygote's next message, or None after `timeout_s`."""
        if not select.select([self._sock], [], [], max(0.0, timeout_s))[0]:
            return None
        message = self._sock.recv(1 << 16)
        if not message:
            self._log.seek(0)
            raise RuntimeError("the zygote exited:\n" + self._log.read().decode()[-3000:])
        message = json.loads(message)
        if "exit" in message:
            self._exits[message["exit"]] = message["code"]
        return message

    def wait_ready(self) -> None:
        with self._lock:
            if not self._ready:
                message = self._receive(READY_TIMEOUT_S)
                assert message and "ready" in message, f"zygote not ready: {message}"
                self._ready = True

    def spawn(self, code: str, *args: str, stdout=subprocess.PIPE,
              stderr=subprocess.PIPE) -> Child:
        """Forks a child running `code` with `sys.argv[1:] == args`; `stdout`, `stderr`:
        `subprocess.PIPE` or `subprocess.DEVNULL`."""
        self.wait_ready()
        ends, ours = [os.open(os.devnull, os.O_RDONLY)], []
        for choice in (stdout, stderr):
            if choice == subprocess.PIPE:
                read, write = os.pipe()
                ends.append(write)
                ours.append(open(read, encoding="utf-8", errors="replace"))  # noqa: SIM115
            else:
                ends.append(os.open(os.devnull, os.O_WRONLY))
                ours.append(None)
        with self._lock:
            try:
                socket.send_fds(self._sock, [json.dumps({"code": code, "args": args}).encode()],
                                ends)
            finally:
                for fd in ends:
                    os.close(fd)
            message = self._receive(60.0)
            while message is not None and "pid" not in message:
                message = self._receive(60.0)
            assert message, "the zygote did not fork"
            # The kernel reuses pids (pid_max is often 32768, and TensorFlow's threads take pids
            # too): an exit recorded for an earlier child with this pid is not this child's.
            self._exits.pop(message["pid"], None)
        return Child(self, message["pid"], *ours)

    def returncode(self, pid: int, timeout_s: float) -> int | None:
        """`pid`'s exit status once the zygote has reaped it, waiting up to `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while pid not in self._exits:
                if self._receive(deadline - time.monotonic()) is None:
                    return None  # no message until the deadline
            return self._exits[pid]

    def close(self) -> None:
        self._sock.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


class Child:
    """A forked child: `pid`, `stdout`, `stderr`, `returncode`, and Popen's `poll`, `wait`,
    `send_signal`, `kill` and `communicate`."""

    def __init__(self, zygote: Zygote, pid: int, stdout, stderr):
        self._zygote = zygote
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self.returncode: int | None = None
        self.args = f"<forked child {pid}>"

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.returncode(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._zygote.returncode(self.pid, 1e6 if timeout is None
                                                      else timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Reads stdout and stderr to their ends (in threads), then waits for the exit."""
        deadline = time.monotonic() + (1e6 if timeout is None else timeout)
        outputs: list = [None, None]

        def read(k, stream):
            outputs[k] = stream.read()
            stream.close()

        readers = [threading.Thread(target=read, args=(k, s), daemon=True)
                   for k, s in enumerate((self.stdout, self.stderr)) if s is not None]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(max(0.0, deadline - time.monotonic()))
        return outputs[0], outputs[1]


_ZYGOTE: Zygote | None = None


def start() -> Zygote:
    """The test process's zygote, started (not waited for) on the first call."""
    global _ZYGOTE
    if _ZYGOTE is None:
        _ZYGOTE = Zygote()
        atexit.register(_ZYGOTE.close)
    return _ZYGOTE


def spawn(code: str, *args: str, stdout=subprocess.PIPE, stderr=subprocess.PIPE) -> Child:
    """`start().spawn(...)`: a child forked from the zygote running `code` (see the module)."""
    return start().spawn(code, *args, stdout=stdout, stderr=stderr)


# `python SCRIPT ARGS` in a forked child: the script's folder first on sys.path, the given working
# folder and environment, the script run as `__main__` (absl's `app.run` exits with its status).
_RUN_SCRIPT = """
import json, os, runpy, sys
script, cwd, env = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
os.chdir(cwd)
os.environ.clear()
os.environ.update(env)
sys.argv = [script, *sys.argv[4:]]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
"""


def popen_script(script, *args: str, cwd=None, env=None, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE) -> Child:
    """`subprocess.Popen([sys.executable, script, *args], cwd=cwd, env=env, text=True)` as a
    forked child; `env` defaults to this process's environment with TF_CPP_MIN_LOG_LEVEL=3."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3") if env is None else dict(env)
    return spawn(_RUN_SCRIPT, str(script), str(cwd or os.getcwd()), json.dumps(env),
                 *map(str, args), stdout=stdout, stderr=stderr)


def run_script(script, *args: str, timeout: float = 300, cwd=None,
               env=None) -> subprocess.CompletedProcess:
    """`subprocess.run([sys.executable, script, *args], capture_output=True, text=True, ...)` as a
    forked child (see `popen_script`); kills it and raises `subprocess.TimeoutExpired` after
    `timeout` seconds."""
    child = popen_script(script, *args, cwd=cwd, env=env)
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        raise
    return subprocess.CompletedProcess([sys.executable, str(script), *args], child.returncode,
                                       stdout, stderr)


if __name__ == "__main__":
    _zygote_main(int(sys.argv[1]))
