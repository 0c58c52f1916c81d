"""Domain errors of the recommendation API, each mapped to a status and a machine code."""

from __future__ import annotations

from services.contract import K_TOO_LARGE, ServiceError


class RecommendError(ServiceError):
    """Base of every error this service reports as an :class:`~services.contract.ErrorBody`."""


class InvalidUserVector(RecommendError):
    """The user vector has the wrong length, or is not finite."""

    status_code = 422
    code = "invalid_user_vector"


class UnknownItems(RecommendError):
    """An excluded item id is not in the catalogue."""

    status_code = 422
    code = "unknown_items"


class InvalidRequest(RecommendError):
    """Any other bad request parameter (e.g. ``k``)."""

    status_code = 422
    code = "invalid_request"


class KTooLarge(RecommendError):
    """``k`` above this service's bound (``FEDREC_REC_MAX_K``)."""

    status_code = 422
    code = K_TOO_LARGE


class NoModel(RecommendError):
    """No model version has been loaded yet."""

    status_code = 503
    code = "no_model"


class ModelLoadError(Exception):
    """A downloaded model version could not be turned into a serving snapshot."""
