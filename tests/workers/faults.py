"""Fault injection for multi-rank tests: stop, kill or slow a chosen rank at a chosen step (or before finish()).

Set in the job's environment; a worker calls :func:`inject` at the start of every step and once before finish():
- TEST_FAULT: stop (SIGSTOP: alive but frozen, heartbeat silent), kill (SIGKILL: gone without a word),
  slow (sleep TEST_FAULT_SECONDS, default 5), collective (a Horovod allreduce of the script's own; every rank
  calls it at that step: TEST_FAULT_RANK=*).
- TEST_FAULT_RANK: the rank (default: the last one), or * for every rank.
- TEST_FAULT_STEP: the rank's own step count at which to act (0-based), or `finish` (just before finish()).
- TEST_FAULT_DELAY: seconds to sleep before acting (default 0), e.g. so that the others are inside finish().
"""
import os
import signal
import sys
import time


def settings(size):
    fault = os.environ.get("TEST_FAULT", "")
    at = os.environ.get("TEST_FAULT_STEP", "")
    rank = os.environ.get("TEST_FAULT_RANK", str(size - 1))
    return fault, rank, at


def inject(step, rank, size, where="step", collective=None):
    """Act if this (rank, step) or (rank, 'finish') is the configured fault. `collective`: a callable running one
    Horovod collective of the script's own (for TEST_FAULT=collective)."""
    fault, who, at = settings(size)
    if not fault or who not in ("*", str(rank)):
        return
    if where == "finish":
        if at != "finish":
            return
    elif at == "finish" or int(at) != step:
        return
    # The wall-clock time lets a test measure how long the job took to end after the fault.
    print(f"fault: {fault} on rank {rank} at {where} {step} (time {time.time():.3f})", flush=True)
    sys.stderr.flush()
    time.sleep(float(os.environ.get("TEST_FAULT_DELAY", "0")))
    if fault == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault == "slow":
        time.sleep(float(os.environ.get("TEST_FAULT_SECONDS", "5")))
    elif fault == "collective":
        collective()
    else:
        raise ValueError(f"TEST_FAULT={fault!r}; accepted: stop|kill|slow|collective")
