"""Narrower rings for secure aggregation: fixed point, masks and messages in 32-bit (or 16- and
8-bit) words, with the overflow bound derived from the cohort and the range; 64-bit words are
the default and unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedrecgel.config import DEFAULTS
from fedrecgel.fixedpoint import FixedPoint, OverflowRefused
from fedrecgel.secagg import crypto
from fedrecgel.secagg.local import Faults, secure_sum
from fedrecgel.secagg.messages import MessageError, decode_masked, encode_masked
from fedrecgel.secagg.protocol import Masked, RoundSpec

COHORT = tuple(range(2, 2 + 3 * 10, 3))  # 10 clients


def test_a_32_bit_encoding_round_trips_within_half_a_step_and_clips() -> None:
    fp = FixedPoint(range_=2.0, scale_bits=20, word_bits=32)
    x = np.array([0.0, 1e-7, -1.5, 1.999999, 3.0, -7.0])
    words, clipped = fp.encode(x)
    assert words.dtype == np.uint32 and clipped == 2
    back = fp.decode(words)
    assert np.abs(back[:4] - x[:4]).max() <= fp.step / 2
    assert back[4] == 2.0 and back[5] == -2.0


@pytest.mark.parametrize("bits", [8, 16, 32])
def test_the_narrow_cohort_bound_is_exactly_where_the_sum_would_wrap(bits: int) -> None:
    fp = FixedPoint(range_=1.0, scale_bits=bits - 4, word_bits=bits)  # one value is 2^(w-4)
    assert fp.max_cohort() == 7
    words, _ = fp.encode(np.ones(1))
    total = np.zeros(1, dtype=fp.dtype)
    for _ in range(7):
        total += words
    assert fp.decode(total)[0] == 7.0
    total += words
    assert fp.decode(total)[0] < 0  # one more wraps: what check_cohort refuses
    with pytest.raises(OverflowRefused, match=f"{bits}-bit"):
        fp.check_cohort(8)


def test_the_finest_scale_is_the_largest_whose_cohort_sum_cannot_wrap() -> None:
    fp = FixedPoint.finest(16.0, 122, 32, 32)
    assert (fp.scale_bits, fp.word_bits) == (20, 32)  # 122 * 16 * 2^20 < 2^31 <= ... * 2^21
    assert fp.max_cohort() >= 122
    assert FixedPoint(16.0, 21, 32).max_cohort() < 122
    assert FixedPoint.finest(16.0, 122, 32, 12).scale_bits == 12  # capped
    assert FixedPoint.finest(1.0, 122, 8, 0).word_bits == 8  # counts of a cohort fit a byte
    with pytest.raises(OverflowRefused, match="any scale"):
        FixedPoint.finest(1.0, 200, 8, 0)


def test_the_64_bit_default_is_unchanged() -> None:
    fp = DEFAULTS.secagg_fixed_point()
    assert fp.word_bits == 64 and fp.dtype is np.uint64
    words, _ = fp.encode(np.array([-1.0, 0.5]))
    assert words.dtype == np.uint64 and words[0] == 2**64 - 2**32
    key = bytes(range(32))
    wide, narrow = crypto.prg_words(key, 4), crypto.prg_words(key, 8, 32)
    assert wide.dtype == np.uint64 and narrow.dtype == np.uint32
    # the same keystream read in other words
    assert wide.tobytes() == narrow.tobytes()


@pytest.mark.parametrize("bits", [8, 16, 32, 64])
def test_masking_in_place_adds_and_subtracts_the_same_keystream_mod_the_word(bits: int) -> None:
    dtype = np.dtype(f"uint{bits}")
    rng = np.random.default_rng(bits)
    for n in (1000, 7, 3000):  # the reused buffer grows, then a shorter vector follows
        key = rng.bytes(32)
        x = rng.integers(0, np.iinfo(dtype).max, n, dtype=dtype, endpoint=True)
        acc = x.copy()
        crypto.mask_into(acc, key)
        # the AES-256-CTR keystream from counter 0, read as little-endian words
        aes = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
        stream = np.frombuffer(aes.update(bytes(n * dtype.itemsize)), dtype=f"<u{dtype.itemsize}")
        assert np.array_equal(crypto.prg_words(key, n, bits), stream)
        assert np.array_equal(acc, x + stream)  # wraps mod 2^w, as the protocol's sum does
        assert not np.array_equal(acc, x)
        crypto.mask_into(acc, key, subtract=True)
        assert np.array_equal(acc, x)


@pytest.mark.parametrize("bits", [16, 32])
def test_a_narrow_round_sums_exactly_with_dropouts(bits: int) -> None:
    fp = FixedPoint.finest(4.0, len(COHORT), bits, 30)
    spec = RoundSpec(5, COHORT, 300, fp, 2, 0.3, 9)
    rng = np.random.default_rng(1)
    x = {u: rng.uniform(-4.0, 4.0, 300) for u in COHORT}
    gone = COHORT[3]
    r = secure_sum(spec, x, Faults(no_input=frozenset({gone})), record=[COHORT[0]])
    assert r.masked[COHORT[0]].dtype == fp.dtype
    want = sum(v for u, v in x.items() if u != gone)
    assert r.outcome.dropped == (gone,)
    assert np.abs(r.outcome.total - want).max() <= len(COHORT) * fp.step / 2


def test_a_narrow_masked_message_round_trips_and_its_word_is_checked() -> None:
    y = np.arange(6, dtype=np.uint32) * 1_000_000_007
    m = Masked(3, y, (4,))
    body = encode_masked(m)
    assert len(body) < 6 * 8 + 200  # 4-byte words on the wire
    back = decode_masked(body, 6, np.uint32)
    assert back.y.dtype == np.uint32 and np.array_equal(back.y, y) and back.complaints == (4,)
    with pytest.raises(MessageError, match="uint64"):
        decode_masked(body, 6)
    with pytest.raises(MessageError, match="ring word"):
        encode_masked(Masked(3, y.astype(np.float32)))
