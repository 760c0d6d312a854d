"""A template process that has imported torch, forked into workers (``python -m`` this module).

Every worker pays ``import torch`` and the parts of it torch_xla pulls in (dynamo, inductor's
lowerings, functorch), 4-5 s of CPU on a 2-core host, before its own runtime is imported. This
process pays it once: it imports torch (never torch_xla: what torch_xla reads from the
environment differs per worker), then forks a worker per request, and each child sets its own
environment and imports its runtime, as a spawned worker would.

Protocol (one request per connection on the Unix socket named on the command line): the client
sends a JSON object ``{"env": {...}, "cwd": "..."}`` with four file descriptors (the child's
stdin, stdout and stderr, and a status pipe). The child becomes ``python -m tpu_workbench.worker``
on those stdio fds, in a session of its own; the reply is ``{"pid": N}``. When a child exits, its
wait status is written to its status pipe as text and the pipe is closed. The template exits when
its stdin reaches EOF (its parent is gone); its children carry on.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import sys

_STATUS: dict[int, int] = {}  # child pid -> the write end of its status pipe
_OWN_FDS: list[int] = []  # the template's own pipes, closed in every child


# What every worker imports before its runtime: torch, then the parts of it torch_xla loads.
# The template says "ready" once torch is in (a plain-PyTorch worker needs no more) and imports
# the rest one module at a time while no request waits; a child forked before that imports
# what is still missing itself, as a spawned worker would.
LATER = ["torch._dynamo", "functorch.compile", "torch._inductor.lowering",
         "torch._inductor.fx_passes.post_grad"]


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = _STATUS.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):  # OSError: the worker's owner is gone
                os.write(fd, str(status).encode())
            os.close(fd)


def _become_worker(fds: list[int], env: dict[str, str], cwd: str, closing: list) -> None:
    """In the child: the request's stdio and environment, then the worker's own main."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for thing in closing:
        thing.close()
    for fd in [*_STATUS.values(), *_OWN_FDS]:
        os.close(fd)
    _STATUS.clear()
    stdin, stdout, stderr, status = fds
    os.close(status)  # the template's to write, not the child's
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    # The template's own streams wrap fds 0-2 with its buffering; a worker's are line-buffered.
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if sys.path and sys.path[0] == _START_CWD:
        sys.path[0] = cwd  # as `python -m` started in `cwd` would have it
    sys.argv = [sys.argv[0]]
    # The worker's own entry point; SystemExit ends this process through the normal shutdown
    # (nothing above catches it), as it would end a spawned worker.
    runpy.run_module("tpu_workbench.worker", run_name="__main__", alter_sys=True)
    sys.exit(0)


def _serve_one(conn: socket.socket, closing: list) -> None:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 4)
    if len(fds) != 4:
        for fd in fds:
            os.close(fd)
        conn.sendall(b'{"error": "expected 4 file descriptors"}\n')
        return
    request = json.loads(data)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.setsid()  # its own session, like a spawned worker, before the parent hears its pid
        os.write(ready_w, b"x")
        os.close(ready_w)
        _become_worker(fds, request["env"], request["cwd"], [conn, *closing])
        os._exit(1)  # not reached
    os.close(ready_w)
    os.read(ready_r, 1)  # the child is in its own session now: killpg(pid) reaches it
    os.close(ready_r)
    stdin, stdout, stderr, status = fds
    for fd in (stdin, stdout, stderr):
        os.close(fd)
    _STATUS[pid] = status
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def main(path: str) -> None:
    import torch  # noqa: F401
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    wake_r, wake_w = os.pipe()
    _OWN_FDS.extend((wake_r, wake_w))
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd does the work
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    selector.register(sys.stdin, selectors.EVENT_READ, "parent")
    wake = os.fdopen(wake_r, "rb", buffering=0, closefd=False)
    print("ready", flush=True)
    later = list(LATER)
    while True:
        events = selector.select(0 if later else None)
        if not events and later:
            importlib.import_module(later.pop(0))
            continue
        for key, _ in events:
            if key.data == "parent" and not sys.stdin.buffer.read1(1):
                return  # the parent is gone (or closed our stdin): no more requests
            if key.data == "child":
                wake.read(512)
                _reap()
            elif key.data == "accept":
                conn, _ = server.accept()
                with conn:
                    _serve_one(conn, [server, selector, wake])
        _reap()


_START_CWD = os.getcwd()

if __name__ == "__main__":
    main(sys.argv[1])
