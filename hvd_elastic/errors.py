"""Errors that stop a run with one clear line instead of a traceback wall."""
import sys


class HvdElasticError(RuntimeError):
    """Base class of hvd-elastic's errors that end a run with a one-line reason."""


class ConfigError(HvdElasticError, ValueError):
    """A setting is unknown, malformed, out of range, or ranks disagree on it."""


_PREVIOUS_HOOK = None


def _one_line_excepthook(exc_type, exc, tb):
    # Uncaught hvd-elastic errors print one line per rank (the launcher prefixes the rank); others keep Python's hook.
    if isinstance(exc, HvdElasticError):
        sys.stderr.write(f"hvd_elastic: error: {exc}\n")
        sys.stderr.flush()
        return
    (_PREVIOUS_HOOK or sys.__excepthook__)(exc_type, exc, tb)


def install_excepthook():
    """Make uncaught HvdElasticError print a single line (idempotent)."""
    global _PREVIOUS_HOOK
    if sys.excepthook is not _one_line_excepthook:
        _PREVIOUS_HOOK = sys.excepthook
        sys.excepthook = _one_line_excepthook
