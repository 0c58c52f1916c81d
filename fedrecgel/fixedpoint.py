"""Fixed-point encoding of float vectors into the ring Z_{2^w} (numpy unsigned words of
``word_bits`` w = 64 by default, or 32, 16 or 8).

A value ``x`` is clipped to ``[-range_, range_]`` and encoded as ``round(x * 2^scale_bits)``
modulo 2^w (two's complement). Sums of encoded vectors wrap modulo 2^w exactly as the masks
do, and decode correctly as long as the true sum lies in ``(-2^(w-1), 2^(w-1))``: that holds for
any cohort of at most :meth:`FixedPoint.max_cohort` clients, which :meth:`FixedPoint.check_cohort`
enforces before a round starts. The error of one encoded value is at most half a step
(``2^-(scale_bits+1)``), so the error of a mean over any number of clients is at most that too.
:meth:`FixedPoint.finest` picks the largest scale whose cohort sum cannot wrap in w bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: the default ring: 64-bit words; a sum decodes correctly while |sum| < 2^63
WORD_BITS = 64
#: the word sizes a ring may have: unsigned word type, signed type of the same width
WORDS: dict[int, tuple[type[np.unsignedinteger[Any]], type[np.signedinteger[Any]]]] = {
    64: (np.uint64, np.int64),
    32: (np.uint32, np.int32),
    16: (np.uint16, np.int16),
    8: (np.uint8, np.int8),
}


class OverflowRefused(ValueError):
    """A cohort too large for the encoding (its sum could wrap), or values out of range in
    ``refuse`` mode."""


@dataclass(frozen=True)
class FixedPoint:
    """Encoding parameters: values in ``[-range_, range_]``, step ``2^-scale_bits``, words of
    ``word_bits``."""

    range_: float
    scale_bits: int
    word_bits: int = WORD_BITS

    def __post_init__(self) -> None:
        if not (self.range_ > 0 and 0 <= self.scale_bits <= 60):
            raise ValueError("range must be > 0 and scale_bits in [0, 60]")
        if self.word_bits not in WORDS:
            raise ValueError(f"word_bits must be one of {sorted(WORDS)}")

    @classmethod
    def finest(cls, range_: float, cohort: int, word_bits: int, max_scale: int) -> FixedPoint:
        """The encoding of ``range_`` in ``word_bits`` words with the largest scale (at most
        ``max_scale``) whose sum over ``cohort`` clients cannot wrap (:class:`OverflowRefused`
        when not even scale 0 fits)."""
        for bits in range(max_scale, -1, -1):
            fp = cls(range_, bits, word_bits)
            if fp.max_cohort() >= cohort:
                return fp
        raise OverflowRefused(
            f"a cohort of {cohort} clients with values in [-{range_:g}, {range_:g}] can wrap "
            f"{word_bits}-bit words at any scale"
        )

    @property
    def dtype(self) -> type[np.unsignedinteger[Any]]:
        """The numpy type of a word."""
        return WORDS[self.word_bits][0]

    @property
    def signed(self) -> type[np.signedinteger[Any]]:
        """The signed numpy type of a word's width (two's complement of the same bits)."""
        return WORDS[self.word_bits][1]

    @property
    def step(self) -> float:
        """The quantisation step."""
        return 2.0**-self.scale_bits

    def max_abs_word(self) -> int:
        """The largest encoded magnitude of one value."""
        return int(np.ceil(self.range_ * 2.0**self.scale_bits))

    def max_cohort(self) -> int:
        """Most clients whose sum cannot wrap: n * max_abs_word < 2^(w-1)."""
        largest: int = 2 ** (self.word_bits - 1) - 1
        return max(0, largest // self.max_abs_word())

    def check_cohort(self, n: int) -> None:
        """Refuse a cohort whose sum could wrap around the ring."""
        if n > self.max_cohort():
            raise OverflowRefused(
                f"cohort of {n} exceeds {self.max_cohort()}, the most whose sum cannot wrap "
                f"with range {self.range_:g} and scale 2^{self.scale_bits}"
                + ("" if self.word_bits == WORD_BITS else f" in {self.word_bits}-bit words")
            )

    def encode(self, x: np.ndarray, refuse: bool = False) -> tuple[np.ndarray, int]:
        """(words, clipped): ``x`` as unsigned words (a fresh array, never a view of ``x``);
        values beyond the range are clipped (their count returned), or refused with
        :class:`OverflowRefused` when ``refuse``."""
        v = np.asarray(x).ravel()
        if v.dtype not in (np.float32, np.float64):
            v = v.astype(np.float64)
        # float32 input stays float32: scaling by a power of two, clipping and rounding are
        # exact in it (|v| * 2^scale_bits < 2^(w-1) fits its exponent), as they are in float64
        mag = np.abs(v)
        top = float(mag.max()) if v.size else 0.0
        if not np.isfinite(top):
            raise OverflowRefused("vector contains NaN or Inf")
        clipped = int(np.count_nonzero(mag > self.range_)) if top > self.range_ else 0
        if clipped and refuse:
            raise OverflowRefused(f"{clipped} values outside [-{self.range_:g}, {self.range_:g}]")
        q = mag  # reused: the scaled, clipped and rounded values
        np.clip(v, -self.range_, self.range_, out=q)
        np.multiply(q, 2.0**self.scale_bits, out=q)
        np.rint(q, out=q)
        # |q| <= max_abs_word < 2^(w-1): the cast to w-bit signed words is exact
        return q.astype(self.signed).view(self.dtype), clipped

    def decode(self, words: np.ndarray) -> np.ndarray:
        """A (summed) word vector back to float64 (two's complement, then / 2^scale_bits)."""
        w = np.asarray(words, dtype=self.dtype)
        return w.view(self.signed).astype(np.float64) / 2.0**self.scale_bits
