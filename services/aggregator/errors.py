"""Domain errors: one base class, mapped to ``{"error", "detail"}`` by one handler."""

from __future__ import annotations

from services.contract import ServiceError


class AggregatorError(ServiceError):
    """Base of every refusal; ``status_code`` is the HTTP status, ``code`` the machine code."""


class Unauthorized(AggregatorError):
    """No or bad credentials (401)."""

    status_code = 401
    code = "unauthorized"


class Forbidden(AggregatorError):
    """Authenticated, but not allowed to do this (403)."""

    status_code = 403
    code = "forbidden"


def not_owned(client_id: int) -> Forbidden:
    """403 ``not_owned``: a message or update of a client the caller's token does not hold."""
    return Forbidden(f"client {client_id} is not held by this token", "not_owned")


def not_in_cohort(client_id: int, round_id: int, attempt: int) -> Forbidden:
    """403 ``not_in_cohort``: a client outside the cohort of the round's current attempt."""
    return Forbidden(
        f"client {client_id} is not in the cohort of round {round_id} (attempt {attempt})",
        "not_in_cohort",
    )


class NotFound(AggregatorError):
    """The thing asked for does not exist (404)."""

    status_code = 404
    code = "not_found"


class Gone(AggregatorError):
    """The thing asked for existed but was removed for good (410)."""

    status_code = 410
    code = "gone"


class Conflict(AggregatorError):
    """The request conflicts with the current state (409)."""

    status_code = 409
    code = "conflict"


class BodyTooLarge(AggregatorError):
    """The request body exceeds the configured limit (413)."""

    status_code = 413
    code = "body_too_large"


class Malformed(AggregatorError):
    """The body cannot be accepted as it is (422)."""

    status_code = 422
    code = "malformed"


class UnsupportedMediaType(AggregatorError):
    """The body is not of the media type the endpoint reads (415)."""

    status_code = 415
    code = "unsupported_media_type"


class Unavailable(AggregatorError):
    """A dependency the request needs does not answer (503, with Retry-After)."""

    status_code = 503
    code = "unavailable"
