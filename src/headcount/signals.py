"""Stop requests (SIGINT, SIGTERM) passed on from a supervising process to the processes it runs.

A workflow manager that gets SIGTERM or SIGINT by itself (`kill PID`, a batch system or service
manager that signals one process, Ctrl-C in a terminal that does not own the process group) does
not pass it on: Snakemake answers SIGTERM by waiting for the running jobs to finish, and SIGINT by
waiting for them as well, so a training job of an hour keeps the run, and its lock, alive for that
hour. Passed on, the signal reaches the jobs, which stop at once (training first saves a
checkpoint), and the manager exits as soon as they have.

The signal handler itself only writes the signal's number to a pipe. A thread started beforehand
reads it, signals the descendants and then calls the handler that was installed before. Nothing
that takes a lock runs inside the handler: Snakemake's SIGTERM handler takes its scheduler's lock,
and called inside the signal handler it deadlocked whenever the signal landed while the main thread
held that lock (job selection, say); starting a thread there takes threading's own locks. Python's
default SIGINT handler, which raises KeyboardInterrupt where the main thread is, still runs in place.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def signal_descendants(pid: int, signum: int) -> None:
    import psutil

    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.send_signal(signum)


def pass_on_stop_signals(signals=STOP_SIGNALS) -> None:
    """From now on, a stop signal this process receives goes to all its descendant processes
    first, and then to the handler that was installed before (call this after that one is)."""
    import psutil  # noqa: F401 - imported now, not first inside a signal handler

    me = os.getpid()
    previous = {int(number): signal.getsignal(number) for number in signals}
    read_end, write_end = os.pipe()

    def pass_on() -> None:
        while True:
            signum = os.read(read_end, 1)[0]
            signal_descendants(me, signum)
            handler = previous[signum]
            if callable(handler) and handler is not signal.default_int_handler:
                handler(signum, None)

    threading.Thread(target=pass_on, name="pass on stop signals", daemon=True).start()

    def handler(signum, frame):
        before = previous[signum]
        if os.getpid() != me:  # a forked child that inherited the handler: as if never installed
            if callable(before):
                before(signum, frame)
            return
        if callable(before) or before == signal.SIG_IGN:
            os.write(write_end, bytes([signum]))
            if before is signal.default_int_handler:
                before(signum, frame)  # KeyboardInterrupt, in the main thread
        else:  # SIG_DFL: end as the signal would, the children first, or they would outlive this process
            signal_descendants(me, signum)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(me, signum)

    for number in signals:
        signal.signal(number, handler)
