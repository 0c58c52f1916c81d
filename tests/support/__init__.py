"""Helpers of the tests only; what the benchmarks share with the tests is the ``harness``
package (``tests.support.aggregator`` and ``tests.support.loopback`` re-export its names)."""
