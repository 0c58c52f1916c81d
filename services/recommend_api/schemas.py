"""Request and response bodies of the recommendation API."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class UserVector(BaseModel):
    """The device's own user embedding; used for one answer, never stored or logged."""

    model_config = ConfigDict(extra="forbid")

    user_gmf: list[float]
    user_mlp: list[float] | None = None


class RecommendationRequest(BaseModel):
    """Top-``k`` items for ``user``, leaving out the item ids in ``exclude``."""

    model_config = ConfigDict(extra="forbid")

    user: UserVector
    k: int = 10
    exclude: list[str] = Field(default_factory=list)


class ScoredItem(BaseModel):
    """One recommended item: its dataset id and its model logit."""

    item: str
    score: float


class RecommendationResponse(BaseModel):
    """The ranking and the model version that produced it."""

    model_version: int
    items: list[ScoredItem]


class ErrorBody(BaseModel):
    """Every error answer."""

    error: str
    detail: str
