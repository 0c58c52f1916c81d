"""The benchmark programs and the report generators of docs/RESULTS.md, each run from the
repository's root as ``python -m bench.NAME`` (``python -m bench.report`` rewrites the
report). A package of the repository, not of the installed project; what it shares with the
tests is the ``harness`` package."""
