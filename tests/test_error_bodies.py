"""The services' shared error answers: a body that is not JSON says so in words."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from services.error_handlers import install_error_handlers


class _Body(BaseModel):
    k: int


def _app(skip_body: bool) -> TestClient:
    app = FastAPI()
    install_error_handlers(app, skip_body=skip_body)

    @app.post("/x")
    def x(body: _Body) -> dict[str, int]:
        return {"k": body.k}

    return TestClient(app)


@pytest.mark.parametrize("skip_body", [False, True])
@pytest.mark.parametrize(
    ("body", "where"), [(b"garbage", "Expecting value at character 0"), (b'{"k": 1', "character 7")]
)
def test_a_body_that_is_not_json_is_named_as_such(skip_body: bool, body: bytes, where: str) -> None:
    r = _app(skip_body).post("/x", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert detail.startswith("the body is not valid JSON (") and where in detail, detail


@pytest.mark.parametrize("media", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_json_body_under_another_media_type_is_415_naming_the_header(media: str) -> None:
    """curl -d sends a form's media type; the answer was 422 'Input should be a valid
    dictionary', which does not say what to change."""
    headers = {"Content-Type": media} if media else {}
    r = _app(False).post("/x", content=b'{"k": 1}', headers=headers)
    assert r.status_code == 415 and r.json()["error"] == "unsupported_media_type"
    assert "Content-Type: application/json" in r.json()["detail"]
    assert (media or "no Content-Type") in r.json()["detail"]
    r = _app(False).post("/x", content=b"", headers=headers)  # no body at all: it is missing
    assert r.status_code == 422 and "Field required" in r.json()["detail"], r.text
