"""Shamir's t-of-n secret sharing of short byte strings over the prime field GF(2^521 - 1).

Secrets up to 64 bytes (X25519 private keys and 32-byte seeds here) are read as integers below
the Mersenne prime p = 2^521 - 1; a random polynomial of degree t - 1 with the secret as its
constant term is evaluated at the share points x (client ids + 1, never 0). Any t shares give
the secret back by Lagrange interpolation at 0; fewer than t shares are independent of the
secret (every candidate secret is equally likely). Coefficients come from :mod:`secrets`.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

#: the field: the Mersenne prime 2^521 - 1 (larger than any 64-byte secret)
PRIME = 2**521 - 1
#: bytes of a share's y value on the wire
SHARE_BYTES = 66
MAX_SECRET_BYTES = 64


class NotEnoughShares(ValueError):
    """Fewer shares than the threshold (the secret cannot be recovered)."""


def split(secret: bytes, xs: Sequence[int], threshold: int) -> dict[int, int]:
    """Shares of ``secret`` at points ``xs`` (distinct, in [1, p)); any ``threshold`` of them
    recover it."""
    if not secret or len(secret) > MAX_SECRET_BYTES:
        raise ValueError(f"secret must be 1..{MAX_SECRET_BYTES} bytes")
    if not 1 <= threshold <= len(xs):
        raise ValueError(f"threshold {threshold} must be in [1, {len(xs)}]")
    if len(set(xs)) != len(xs) or any(not 0 < x < PRIME for x in xs):
        raise ValueError("share points must be distinct and in [1, p)")
    # a length prefix keeps leading zero bytes of the secret
    s = int.from_bytes(bytes([len(secret)]) + secret, "big")
    coeffs = [s] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    out = {}
    for x in xs:
        y = 0
        for c in reversed(coeffs):  # Horner
            y = (y * x + c) % PRIME
        out[x] = y
    return out


def combine(shares: dict[int, int], threshold: int) -> bytes:
    """The secret from at least ``threshold`` shares (x -> y); uses the ``threshold`` shares
    of the smallest x. :class:`NotEnoughShares` when there are fewer."""
    if len(shares) < threshold:
        raise NotEnoughShares(f"{len(shares)} shares, {threshold} needed")
    pts = sorted(shares.items())[:threshold]
    s = 0
    for i, (xi, yi) in enumerate(pts):
        num, den = 1, 1
        for j, (xj, _) in enumerate(pts):
            if i != j:
                num = num * (-xj) % PRIME
                den = den * (xi - xj) % PRIME
        s = (s + yi * num * pow(den, -1, PRIME)) % PRIME
    raw = s.to_bytes((s.bit_length() + 7) // 8 or 1, "big")
    n = raw[0]
    if n == 0 or n > MAX_SECRET_BYTES or len(raw) != n + 1:
        # shares of different secrets, or tampered values: not a well-formed secret
        raise ValueError("shares do not interpolate to a well-formed secret")
    return raw[1:]


def to_bytes(y: int) -> bytes:
    """A share value on the wire."""
    return y.to_bytes(SHARE_BYTES, "big")


def from_bytes(b: bytes) -> int:
    """Inverse of :func:`to_bytes` (ValueError on a bad length or a value >= p)."""
    if len(b) != SHARE_BYTES:
        raise ValueError("bad share length")
    y = int.from_bytes(b, "big")
    if y >= PRIME:
        raise ValueError("share value out of the field")
    return y
