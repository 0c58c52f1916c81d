"""Compiled kernels for the simulator's client step (optional: the torch code is the reference).

``sam_kernels.cpp`` runs the three SAM passes of a group of clients one client at a time, for
the aggregate path (the server's weighted mean) of the NCF model: each client's activations
stay in the core's cache from one step to the next, and the elementwise work (bias, ReLU and
its mask, the loss, the gathers and the perturbation) is loops over them instead of separate
passes over the whole group's activations. :func:`fedrecgel.sam.cohort_step` uses it when it
is available and falls back to :mod:`fedrecgel.passes` otherwise; a test holds the two to the
same results.

The library is built with torch's C++ extension tools (a C++ compiler and ninja) the first
time it is needed, about 15 s, into a folder named after a hash of the source, the torch and
Python versions and this CPU (``FEDREC_NATIVE_DIR``, default ``~/.cache/fedrecgel/native``);
later processes load it in under a millisecond. ``python -m fedrecgel.native`` builds it
ahead of time (``scripts/bootstrap.sh`` does). ``FEDREC_NATIVE``: ``auto`` (default: build
or load it if a compiler is there, else use the torch code; a build that failed leaves a
``build-failed`` note in its folder, and later processes use the torch code without trying
again until ``python -m fedrecgel.native`` succeeds; a library is only loaded once its
build finished, so a build killed midway is done again), ``0`` (never use it) or ``1`` (a build
or load that fails is an error).
"""

from __future__ import annotations

import os

MODES = ("auto", "0", "1")


class NativeSettingError(ValueError):
    """FEDREC_NATIVE holds something other than auto, 0 or 1."""


class NativeUnavailable(RuntimeError):
    """FEDREC_NATIVE=1 and the kernels could not be built or loaded."""


def mode() -> str:
    """``FEDREC_NATIVE``: auto, 0 or 1 (anything else is an error naming the variable)."""
    m = os.environ.get("FEDREC_NATIVE", "auto").strip().lower() or "auto"
    if m not in MODES:
        raise NativeSettingError(f"FEDREC_NATIVE must be one of {', '.join(MODES)}, not {m!r}")
    return m


def check() -> str | None:
    """What is wrong with the FEDREC_NATIVE setting, for a command to say at its start (None
    when nothing is). With FEDREC_NATIVE=1 this builds or loads the kernels now."""
    try:
        m = mode()
    except NativeSettingError as e:
        return str(e)
    if m == "1":
        from fedrecgel.native.ops import kernels  # imports torch: only when asked for

        try:
            kernels()
        except NativeUnavailable as e:
            return str(e)
    return None
