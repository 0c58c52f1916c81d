"""The cryptographic primitives of secure aggregation, all from the ``cryptography`` package:
X25519 key agreement, HKDF-SHA256 key derivation, AES-256-GCM authenticated encryption of the
secret shares, an AES-256-CTR keystream as the pseudorandom generator of the masks, and SHA-256
commitments.

Every derived key is bound to its purpose, the round and the ordered pair of clients through
the HKDF ``info`` string, so no key is ever used for two things.
"""

from __future__ import annotations

import hashlib
import os
import threading

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

DOMAIN = b"fedrecgel-secagg-v1"
KEY_BYTES = 32
NONCE_BYTES = 12


class DecryptError(ValueError):
    """A ciphertext that does not authenticate (tampered, wrong key or wrong context)."""


def new_private_key() -> X25519PrivateKey:
    """A fresh X25519 key (one per purpose per round: keys are never reused across rounds)."""
    return X25519PrivateKey.generate()


def public_bytes(sk: X25519PrivateKey) -> bytes:
    """The raw 32-byte public key of ``sk``."""
    return sk.public_key().public_bytes_raw()


def private_bytes(sk: X25519PrivateKey) -> bytes:
    """The raw 32-byte private key (what is secret-shared)."""
    return sk.private_bytes_raw()


def private_from_bytes(b: bytes) -> X25519PrivateKey:
    """Inverse of :func:`private_bytes` (ValueError on a bad length)."""
    return X25519PrivateKey.from_private_bytes(b)


def derive(secret: bytes, purpose: str, round_id: int, a: int, b: int) -> bytes:
    """A 32-byte key for ``purpose`` in round ``round_id`` between clients ``a`` and ``b``."""
    info = DOMAIN + f"|{purpose}|{round_id}|{a}|{b}".encode()
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(secret)


def exchange(sk: X25519PrivateKey, peer_public: bytes) -> bytes:
    """The raw X25519 shared secret of ``sk`` and a peer's public key (only ever an input to
    :func:`derive`)."""
    return sk.exchange(X25519PublicKey.from_public_bytes(peer_public))


def pair_key(shared: bytes, purpose: str, round_id: int, u: int, v: int) -> bytes:
    """The key of clients ``u`` and ``v`` for ``purpose`` from their X25519 ``shared`` secret:
    HKDF over the pair ordered (min, max), so both ends derive the same key."""
    return derive(shared, purpose, round_id, min(u, v), max(u, v))


def agree(
    sk: X25519PrivateKey, peer_public: bytes, purpose: str, round_id: int, u: int, v: int
) -> bytes:
    """The key clients ``u`` and ``v`` agree on for ``purpose``: X25519, then :func:`pair_key`."""
    return pair_key(exchange(sk, peer_public), purpose, round_id, u, v)


def prg_words(key: bytes, n: int, word_bits: int = 64) -> np.ndarray:
    """``n`` pseudorandom unsigned words of ``word_bits`` (64: uint64, or 32, 16, 8): the
    AES-256-CTR keystream of ``key`` from counter 0, read little-endian (every key is derived
    for one pair, round and purpose only, so no keystream is reused). AES-CTR is a PRG under
    the usual assumption that AES is a pseudorandom permutation; it is the faster of the two
    stream ciphers ``cryptography`` offers here (AES-NI)."""
    words = np.zeros(n, dtype=f"uint{word_bits}")
    mask_into(words, key)
    return words


def mask_into(acc: np.ndarray, key: bytes, subtract: bool = False) -> None:
    """``acc += prg_words(key, len(acc), w)`` in place, mod 2^w (``acc``: a 1-D array of
    unsigned w-bit words; ``subtract``: ``-=`` instead). The keystream goes into a buffer this
    thread reuses, so a client adding its masks allocates nothing per mask."""
    size = acc.dtype.itemsize
    nbytes = size * acc.size
    zeros, out = _scratch(nbytes)
    enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    enc.update_into(zeros[:nbytes], out)
    stream = np.frombuffer(out, dtype=f"<u{size}", count=acc.size)
    (np.subtract if subtract else np.add)(acc, stream, out=acc)


_local = threading.local()


def _scratch(nbytes: int) -> tuple[memoryview, bytearray]:
    """This thread's keystream input (zeros) and output buffers, at least ``nbytes`` long
    (grown when a longer vector comes; the output has the block of room ``update_into``
    wants)."""
    have = getattr(_local, "buffers", None)
    if have is None or len(have[0]) < nbytes:
        have = _local.buffers = (memoryview(bytes(nbytes)), bytearray(nbytes + 15))
    return have


def seal(key: bytes, plaintext: bytes, context: bytes) -> bytes:
    """AES-256-GCM: nonce || ciphertext+tag, authenticated together with ``context``."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, context)


def open_sealed(key: bytes, sealed: bytes, context: bytes) -> bytes:
    """Inverse of :func:`seal`; :class:`DecryptError` when it does not authenticate."""
    if len(sealed) < NONCE_BYTES + 16:
        raise DecryptError("ciphertext too short")
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], context)
    except InvalidTag:
        raise DecryptError("ciphertext does not authenticate") from None


def commit(*parts: bytes | int | str) -> bytes:
    """SHA-256 commitment to ``parts`` (domain-separated, length-prefixed)."""
    h = hashlib.sha256(DOMAIN + b"|commit")
    for p in parts:
        if isinstance(p, int):
            p = str(p)
        if isinstance(p, str):
            p = p.encode()
        h.update(len(p).to_bytes(8, "big") + p)
    return h.digest()
