"""Keep a worker's start-up objects out of the garbage collector's full passes.

Importing a worker's modules (torch, SQLAlchemy, httpx, ...) leaves some 300,000 tracked
objects that live as long as the process, and CPython's full collection walks every tracked
object each time it runs: in a 20-round FilmTrust run over HTTP each worker ran at least one
full pass, about 0.2 s of CPU in one piece that stalls the worker's round (one came at the
run's start, when the fresh private states pushed the collector's pending count over its
threshold). :func:`freeze_startup_heap` collects what the imports left as garbage, then moves
everything that is left into the collector's permanent generation (:func:`gc.freeze`): later
passes walk only objects made after it. Reference counting still frees frozen objects once
released; only a reference cycle among them would stay until the process ends.

Called by the worker's ``python -m`` entry once its imports are done: it acts on the whole
interpreter, so code that runs a worker inside another process (the tests) does not call it.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect, then freeze every object alive now (:func:`gc.freeze`); how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
