"""headcount.signals: a stop signal reaches the child processes and then the handler installed before,
without the deadlock of running that handler inside the signal handler."""

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# A stand-in for Snakemake's scheduler: its SIGTERM handler takes a lock that its main thread holds
# while it selects jobs. The signal lands while the main thread holds the lock; a child (a "job")
# must get it too. Run in a process of its own, so that a deadlock fails the test instead of hanging it.
PROGRAM = textwrap.dedent("""
    import os, signal, subprocess, sys, threading, time
    from headcount.signals import pass_on_stop_signals

    lock, stopped = threading.Lock(), threading.Event()

    def exit_gracefully(signum, frame):
        with lock:
            stopped.set()

    signal.signal(signal.SIGTERM, exit_gracefully)
    pass_on_stop_signals()
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(0.5)
    with lock:  # job selection
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the handler has run by now, with the lock still held
        print("handler returned", flush=True)
    print("previous handler ran" if stopped.wait(10) else "previous handler never ran", flush=True)
    print(f"job ended by signal {-job.wait(10)}", flush=True)
""")


@pytest.mark.slow
def test_a_stop_signal_reaches_the_jobs_and_the_previous_handler_without_deadlock():
    src = Path(__file__).resolve().parents[1] / "src"
    try:
        result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=30,
                                env={"PYTHONPATH": str(src)})
    except subprocess.TimeoutExpired:
        raise AssertionError("deadlock: the process still ran 30 s after the signal") from None
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "handler returned", "previous handler ran", f"job ended by signal {int(signal.SIGTERM)}"]
