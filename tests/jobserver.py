"""A warm interpreter for the workflow tests' jobs: Snakemake runs every job's script as usual, but the
Python that runs it is a fork of a process that has already imported torch, transformers, pandas and
matplotlib.

Every workflow job is a process that imports torch (3 CPU s on an AVX2 CPU) and often transformers'
model code (8 s with torch): in a toy DAG that is most of the time, and the real work is a fraction of
a second. Here Snakemake is started with `sys.executable` set to a small client (`client_path`); each
script job runs as `<client> <script>`, and the client hands the script, its working directory, its
environment and its stdin/stdout/stderr to the server, which forks a child to run the script as
`python <script>` would (`runpy`, `__main__`), and hands back the child's exit status. The client
passes SIGTERM/SIGINT/SIGHUP on to the child.

What this does not cover is how a job's own process starts and ends, so the tests of that (a job that
imports no torch, a job killed by a signal, a workflow killed mid-training) run plain jobs: without
`HEADCOUNT_JOBSERVER`, or with `toyflow.snakemake(..., plain=True)`. headcount itself is never
imported by the server: the workflow copies that tests edit import their own src/.

    python tests/jobserver.py serve SOCKET            the server (tests/conftest.py starts one a worker)
    python tests/jobserver.py snakemake ARGS...       Snakemake whose script jobs go to $HEADCOUNT_JOBSERVER
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path

# What a job imports that costs seconds; importing it once here is the point. headcount is not here.
PRELOAD = ("numpy", "pandas", "pyarrow", "pyarrow.parquet", "yaml", "torch", "sentencepiece", "sacrebleu",
           "matplotlib", "transformers", "transformers.modeling_utils", "safetensors.torch")
ENV = "HEADCOUNT_JOBSERVER"


def serve(path: str) -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional package: the job imports what it needs itself
            pass
    if Path(path).exists():
        Path(path).unlink()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    print("ready", flush=True)
    while True:
        connection, _ = server.accept()
        message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        request = json.loads(message.decode())
        pid = os.fork()
        if pid == 0:  # the job
            server.close()
            connection.close()
            run_job(request, fds)
        for fd in fds:
            os.close(fd)
        connection.sendall(f"{pid}\n".encode())
        threading.Thread(target=report_exit, args=(connection, pid), daemon=True).start()


def report_exit(connection: socket.socket, pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    try:
        connection.sendall(f"{code}\n".encode())
    except OSError:  # the client was killed: nobody is waiting
        pass
    connection.close()


def run_job(request: dict, fds: list[int]) -> None:
    """In the forked child: become `python <script> <args>` in the client's directory and
    environment, with the client's stdin, stdout and stderr; never return."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.stdin = os.fdopen(0, "r", closefd=False)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        sys.path[0] = str(Path(sys.argv[0]).resolve().parent)  # as `python script` sets it
        import runpy

        runpy.run_path(sys.argv[0], run_name="__main__")
        code = 0
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            code = done.code or 0
        else:
            print(done.code, file=sys.stderr)
    except BaseException:  # noqa: B036 - a job's traceback goes where `python script` would print it
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                pass
    os._exit(code)


CLIENT = '''#!{python} -I
import json, os, signal, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["{env}"])
request = {{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}
socket.send_fds(s, [json.dumps(request).encode()], [0, 1, 2])
replies = s.makefile()
pid = int(replies.readline())
def forward(signum, _):
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(signum, forward)
line = replies.readline()
sys.exit(int(line) if line.strip() else 1)
'''


def client_path(folder: Path) -> Path:
    """The client script, written to folder (once)."""
    path = folder / "job-python"
    if not path.exists():
        path.write_text(CLIENT.format(python=sys.executable, env=ENV))
        path.chmod(0o755)
    return path


def snakemake_main(args: list[str]) -> None:
    """Snakemake's command line, its script jobs run by the server at $HEADCOUNT_JOBSERVER."""
    sys.executable = str(client_path(Path(os.environ[ENV]).parent))
    from snakemake.cli import main

    sys.argv = ["snakemake", *args]
    main()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif sys.argv[1] == "snakemake":
        snakemake_main(sys.argv[2:])
    else:
        sys.exit(f"usage: {__doc__.splitlines()[-2].strip()}")
