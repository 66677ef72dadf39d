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

Snakemake itself starts the same way: importing it and collecting its plugins takes 2-3 CPU s, most
of a dry run. A second server (`serve SOCKET snakemake`) has imported Snakemake and its plugins, and
runs each `<its client> -m snakemake ARGS` in a fork as `python -m snakemake ARGS` would run; where
the request's environment names a job server ($HEADCOUNT_JOBSERVER), the forked Snakemake's
`sys.executable` is that server's client, so its script jobs go there. A forked Snakemake whose client
is killed (a test's timeout) gets SIGTERM, then SIGKILL.

What this does not cover is how a job's own process starts and ends, so the tests of that (a job that
imports no torch, a job killed by a signal, a workflow killed mid-training) run plain jobs: without
`HEADCOUNT_JOBSERVER`, or with `toyflow.snakemake(..., plain=True)`. headcount itself is never
imported by either server: the workflow copies that tests edit import their own src/.

    python tests/jobserver.py serve SOCKET [jobs|snakemake]   a server (tests/toyflow.py starts them)
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
# Also what jobs import lazily: pyplot (the figures), spaCy (the parses; 1.4 s), the model code of the
# families the tests import, tokenizers, gguf.
PRELOAD = ("numpy", "pandas", "pyarrow", "pyarrow.parquet", "yaml", "torch", "sentencepiece", "sacrebleu",
           "matplotlib", "matplotlib.pyplot", "transformers", "transformers.modeling_utils", "safetensors.torch",
           "tokenizers", "gguf", "psutil", "tqdm", "spacy", "transformers.models.gpt2.modeling_gpt2",
           "transformers.models.bert.modeling_bert", "transformers.models.marian.modeling_marian",
           "transformers.models.qwen2.modeling_qwen2", "transformers.models.llama.modeling_llama")
# What Snakemake imports on a dry run of this workflow, lazily much of it (its plugins, storage,
# source cache, notebook and profile support), and its plugin registries, which scan every installed
# package for plugins on first use. headcount is not here either.
SNAKEMAKE_PRELOAD = ("snakemake.cli", "snakemake.api", "snakemake.workflow", "snakemake.dag", "snakemake.profiles",
                     "snakemake.storage", "snakemake.sourcecache", "snakemake.scheduling.job_scheduler",
                     "snakemake.executors.dryrun", "snakemake.executors.local", "snakemake.utils", "snakemake.report",
                     "yte", "yaml", "jsonschema", "fastjsonschema", "nbformat", "smart_open", "requests",
                     "platformdirs", "packaging.version", "graphlib", "argparse_dataclass", "numpy", "pandas")
REGISTRIES = ("snakemake_interface_executor_plugins.registry:ExecutorPluginRegistry",
              "snakemake_interface_storage_plugins.registry:StoragePluginRegistry",
              "snakemake_interface_report_plugins.registry:ReportPluginRegistry",
              "snakemake_interface_logger_plugins.registry:LoggerPluginRegistry",
              "snakemake_interface_scheduler_plugins.registry:SchedulerPluginRegistry")
ENV = "HEADCOUNT_JOBSERVER"


def preload(kind: str) -> None:
    for name in PRELOAD if kind == "jobs" else SNAKEMAKE_PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional package: the job imports what it needs itself
            pass
    if kind == "snakemake":
        for entry in REGISTRIES:  # singletons: collected here once, every fork finds them filled
            module, name = entry.split(":")
            try:
                getattr(importlib.import_module(module), name)()
            except ImportError:
                pass


def serve(path: str, kind: str = "jobs") -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")
    preload(kind)
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
            run_job(request, fds, connection)
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


def run_job(request: dict, fds: list[int], connection: socket.socket) -> None:
    """In the forked child: become `python <script> <args>` (or `python -m <module> <args>`) in the
    client's directory and environment, with the client's stdin, stdout and stderr; never return."""
    module = request["argv"][1] if request["argv"][:1] == ["-m"] else None
    if module:
        threading.Thread(target=end_with_client, args=(connection,), daemon=True).start()
    else:
        connection.close()
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
        import runpy

        if module:
            import atexit

            atexit._clear()  # the server's own; the module's run at its end
            sys.argv = [module, *request["argv"][2:]]
            sys.path[0] = os.getcwd()  # as `python -m` sets it
            if request["env"].get(ENV):  # Snakemake: its script jobs go to that job server
                sys.executable = str(client_path(Path(request["env"][ENV]).parent))
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            finally:
                atexit._run_exitfuncs()
        else:
            sys.argv = list(request["argv"])
            sys.path[0] = str(Path(sys.argv[0]).resolve().parent)  # as `python script` sets it
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


def end_with_client(connection: socket.socket) -> None:
    """In a forked module run: the client sends nothing, so the connection ends only when the client
    does. If that comes first (the client was killed), stop as a signal would, then for good."""
    import time

    try:
        connection.recv(1)
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(20)
    os.kill(os.getpid(), signal.SIGKILL)


CLIENT = '''#!{python} -I
import json, os, signal, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect({socket!r})
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
    """The client of the server whose socket is folder/socket, written to folder (once)."""
    path = folder / "job-python"
    if not path.exists():
        path.write_text(CLIENT.format(python=sys.executable, socket=str(folder / "socket")))
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
        serve(*sys.argv[2:4])
    elif sys.argv[1] == "snakemake":
        snakemake_main(sys.argv[2:])
    else:
        sys.exit(f"usage: {__doc__.splitlines()[-2].strip()}")
