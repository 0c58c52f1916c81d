"""Every parser of a peer's JSON (wire metadata and headers, secure-aggregation messages, the
aggregator's lists of them) goes through ``fedrecgel.wire.load_json`` and refuses the same
inputs the same way: text that is not JSON, bytes that are not UTF-8, nesting too deep for
the parser (never a RecursionError)."""

from __future__ import annotations

import json

import pytest

from fedrecgel import wire
from fedrecgel.secagg import messages
from services.aggregator import secagg_checks as aggregator_secagg
from services.aggregator.errors import Malformed

NOT_JSON = {
    "garbage": b"{not json",
    "not_utf8": b'{"kind": "\xff\xfe"}',
    "nested_too_deeply": b"[" * 100_000 + b"]" * 100_000,
}


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """What reaches the one parser (each call's input)."""
    seen: list[object] = []
    real = wire.load_json

    def spy(text: str | bytes, what: str) -> object:
        seen.append(text)
        return real(text, what)

    for module in (wire, messages, aggregator_secagg):
        monkeypatch.setattr(module, "load_json", spy)
    return seen


@pytest.mark.parametrize("name", list(NOT_JSON))
def test_the_one_parser_refuses_what_is_not_json(name: str) -> None:
    with pytest.raises(wire.WireError, match="is not valid JSON"):
        wire.load_json(NOT_JSON[name], "it")


@pytest.mark.parametrize("name", list(NOT_JSON))
def test_every_parser_of_peer_json_goes_through_it(name: str, parsed: list[object]) -> None:
    data = NOT_JSON[name]
    header = len(data).to_bytes(8, "little") + data + b"\0" * 8
    assert wire.body_format(header) is None
    with pytest.raises(messages.MessageError, match="not JSON"):
        messages.decode_keys(data)
    with pytest.raises(Malformed, match="not JSON"):
        aggregator_secagg._json_list(data, 10)
    assert parsed == [data, data, data]


def test_json_lists_of_messages_still_parse(parsed: list[object]) -> None:
    body = json.dumps([{"b": 1, "a": 2}]).encode()
    assert aggregator_secagg._json_list(body, 1) == [("a", b'{"a": 2, "b": 1}')]
    assert parsed == [body]


def test_a_list_of_more_messages_than_the_callers_clients_is_refused_unread() -> None:
    """600,000 empty objects in a 2 MB secure-aggregation body were each serialized again
    (2.6 s of CPU) before the first was found malformed."""
    with pytest.raises(Malformed, match="this token holds 2"):
        aggregator_secagg._json_list(b"[" + b",".join([b"{}"] * 3) + b"]", 2)
