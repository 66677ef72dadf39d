"""Stop requests (SIGINT, SIGTERM) passed on from a supervising process to the processes it runs.

A workflow manager that gets SIGTERM or SIGINT by itself (`kill PID`, a batch system or service
manager that signals one process, Ctrl-C in a terminal that does not own the process group) does
not pass it on: Snakemake answers SIGTERM by waiting for the running jobs to finish, and SIGINT by
waiting for them as well, so a training job of an hour keeps the run, and its lock, alive for that
hour. Passed on, the signal reaches the jobs, which stop at once (training first saves a
checkpoint), and the manager exits as soon as they have.

Snakemake's own SIGTERM handler takes its scheduler's lock. Called inside the signal handler, it
deadlocked whenever the signal landed while the main thread held that lock (job selection, say):
the jobs stopped and Snakemake waited for ever. So the previous handler runs in a thread of its
own, which waits for the main thread to let go of the lock; only Python's default SIGINT handler,
which raises KeyboardInterrupt where the main thread is, still runs in place.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def pass_on_stop_signals(signals=STOP_SIGNALS) -> None:
    """From now on, a stop signal this process receives goes to all its descendant processes
    first, and then to the handler that was installed before (call this after that one is)."""
    import psutil

    me = os.getpid()
    for number in signals:
        previous = signal.getsignal(number)

        def handler(signum, frame, previous=previous):
            if os.getpid() == me:  # not in a forked child that inherited the handler
                for child in psutil.Process(me).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        child.send_signal(signum)
            if previous is signal.default_int_handler:
                previous(signum, frame)
            elif callable(previous):
                threading.Thread(target=previous, args=(signum, frame), name=f"on {signal.Signals(signum).name}",
                                 daemon=True).start()
            elif previous != signal.SIG_IGN:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(number, handler)
