"""Shard enrolment tokens (services/enrolment.py): derived from the secret, bound to one shard."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from services.enrolment import (
    EnrolmentTokenError,
    Shard,
    enrolment_token,
    parse_enrolment_token,
    verify_enrolment_token,
)

SECRET = "s3cret-enrolment-key-for-tests-0123456789"


def test_token_is_the_documented_hmac() -> None:
    token = enrolment_token(SECRET, 2, 5)
    expected = hmac.new(SECRET.encode(), b"fedrec-enrol-v1:2/5", hashlib.sha256).hexdigest()
    assert token == f"enrol-v1.2.5.{expected}"
    assert parse_enrolment_token(token) == Shard(2, 5)
    assert verify_enrolment_token(SECRET, token) == Shard(2, 5)


def test_token_of_another_secret_or_shard_is_refused() -> None:
    token = enrolment_token(SECRET, 1, 4)
    assert verify_enrolment_token(SECRET + "x", token) is None
    # the same signature under another shard number is not valid
    forged = token.replace("enrol-v1.1.4.", "enrol-v1.0.4.")
    assert verify_enrolment_token(SECRET, forged) is None
    forged = token.replace("enrol-v1.1.4.", "enrol-v1.1.1.")
    assert verify_enrolment_token(SECRET, forged) is None
    assert verify_enrolment_token("", token) is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "changethis",
        "enrol-v1.1.4",
        "enrol-v1.01.4." + "0" * 64,  # non-canonical number
        "enrol-v1.+1.4." + "0" * 64,
        "enrol-v1.4.4." + "0" * 64,  # shard out of range
        "enrol-v1.0.0." + "0" * 64,
        "enrol-v1.0.99999999." + "0" * 64,
        "enrol-v1.0.4." + "0" * 63,
        "enrol-v1.0.4." + "A" * 64,
        "enrol-v2.0.4." + "0" * 64,
        " enrol-v1.0.4." + "0" * 64,
    ],
)
def test_malformed_tokens_are_refused(text: str) -> None:
    with pytest.raises(EnrolmentTokenError):
        parse_enrolment_token(text)
    assert verify_enrolment_token(SECRET, text) is None


@pytest.mark.parametrize("shard,shards", [(-1, 2), (2, 2), (0, 0), (0, 2_000_000), (True, 2)])
def test_issuing_refuses_bad_shards(shard: int, shards: int) -> None:
    with pytest.raises(EnrolmentTokenError):
        enrolment_token(SECRET, shard, shards)


def test_issuing_refuses_an_empty_secret() -> None:
    with pytest.raises(EnrolmentTokenError):
        enrolment_token("", 0, 1)


def test_shard_owns_its_residue_class() -> None:
    shard = Shard(1, 3)
    assert [i for i in range(10) if shard.owns(i)] == [1, 4, 7]
