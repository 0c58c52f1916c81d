"""Fixed-point encoding of float vectors into the ring Z_{2^64} (numpy ``uint64``).

A value ``x`` is clipped to ``[-range_, range_]`` and encoded as ``round(x * 2^scale_bits)``
modulo 2^64 (two's complement). Sums of encoded vectors wrap modulo 2^64 exactly as the masks
do, and decode correctly as long as the true sum lies in ``(-2^63, 2^63)``: that holds for any
cohort of at most :meth:`FixedPoint.max_cohort` clients, which :meth:`FixedPoint.check_cohort`
enforces before a round starts. The error of one encoded value is at most half a step
(``2^-(scale_bits+1)``), so the error of a mean over any number of clients is at most that too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: the ring: 64-bit words; a sum decodes correctly while |sum| < 2^63
WORD_BITS = 64


class OverflowRefused(ValueError):
    """A cohort too large for the encoding (its sum could wrap), or values out of range in
    ``refuse`` mode."""


@dataclass(frozen=True)
class FixedPoint:
    """Encoding parameters: values in ``[-range_, range_]``, step ``2^-scale_bits``."""

    range_: float
    scale_bits: int

    def __post_init__(self) -> None:
        if not (self.range_ > 0 and 0 <= self.scale_bits <= 60):
            raise ValueError("range must be > 0 and scale_bits in [0, 60]")

    @property
    def step(self) -> float:
        """The quantisation step."""
        return 2.0**-self.scale_bits

    def max_abs_word(self) -> int:
        """The largest encoded magnitude of one value."""
        return int(np.ceil(self.range_ * 2.0**self.scale_bits))

    def max_cohort(self) -> int:
        """Most clients whose sum cannot wrap: n * max_abs_word < 2^63."""
        largest: int = 2 ** (WORD_BITS - 1) - 1
        return max(0, largest // self.max_abs_word())

    def check_cohort(self, n: int) -> None:
        """Refuse a cohort whose sum could wrap around the ring."""
        if n > self.max_cohort():
            raise OverflowRefused(
                f"cohort of {n} exceeds {self.max_cohort()}, the most whose sum cannot wrap "
                f"with range {self.range_:g} and scale 2^{self.scale_bits}"
            )

    def encode(self, x: np.ndarray, refuse: bool = False) -> tuple[np.ndarray, int]:
        """(words, clipped): ``x`` as uint64 words; values beyond the range are clipped (their
        count returned), or refused with :class:`OverflowRefused` when ``refuse``."""
        v = np.asarray(x, dtype=np.float64).ravel()
        if not np.isfinite(v).all():
            raise OverflowRefused("vector contains NaN or Inf")
        out = np.abs(v) > self.range_
        clipped = int(out.sum())
        if clipped and refuse:
            raise OverflowRefused(f"{clipped} values outside [-{self.range_:g}, {self.range_:g}]")
        v = np.clip(v, -self.range_, self.range_)
        q = np.rint(v * 2.0**self.scale_bits).astype(np.int64)
        return q.view(np.uint64), clipped

    def decode(self, words: np.ndarray) -> np.ndarray:
        """A (summed) word vector back to float64 (two's complement, then / 2^scale_bits)."""
        w = np.asarray(words, dtype=np.uint64)
        return w.view(np.int64).astype(np.float64) / 2.0**self.scale_bits
