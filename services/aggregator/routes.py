"""HTTP routes: each one translates a request into one service call and back."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from services.aggregator.errors import BodyTooLarge, UnsupportedMediaType
from services.aggregator.popularity import prior_etag
from services.aggregator.schemas import (
    DEFAULT_HISTORY_LIMIT,
    MAX_HISTORY_LIMIT,
    CurrentRound,
    ErrorBody,
    EvaluationAck,
    EvaluationRequest,
    Health,
    History,
    RegisterRequest,
    RegisterResponse,
    ReleaseRequest,
    ReleaseResponse,
    RoundInfo,
    RunConfig,
    RunStarted,
    RunStatus,
    UploadResponse,
)
from services.aggregator.service import AggregatorService, Caller
from services.contract import (
    MODEL_VERSION_HEADER,
    ItemCountsAck,
    ItemCountsRequest,
    ModelBlob,
    PriorInfo,
    SecAggRound,
    SecAggStep,
)
from services.enrolment import Shard

UPLOAD_PATH = "/v1/rounds/{round_id}/updates"
UPLOAD_MEDIA_TYPE = "application/octet-stream"
#: the largest round number or model version (the columns are 32-bit integers)
MAX_INT32 = 2**31 - 1
RoundId = Annotated[int, Path(ge=0, le=MAX_INT32, description="Round number.")]
Version = Annotated[int, Path(ge=0, le=MAX_INT32, description="Model version.")]
RunId = Annotated[int, Path(ge=1, le=MAX_INT32, description="Run id.")]
M = TypeVar("M", bound=BaseModel)

router = APIRouter()


async def get_service(request: Request) -> AggregatorService:
    """The service built by the app's lifespan."""
    service: AggregatorService = request.app.state.service
    return service


ServiceDep = Annotated[AggregatorService, Depends(get_service)]


async def bearer_token(authorization: Annotated[str | None, Header()] = None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if any."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


TokenDep = Annotated[str | None, Depends(bearer_token)]


# The dependencies run on the event loop (``async def``) unless they may block: FastAPI runs
# each plain ``def`` dependency in a worker thread, a hop there and back per dependency and
# request. Only a token the credentials' cache does not know needs the database.


async def client_caller(service: ServiceDep, token: TokenDep) -> Caller:
    """Authenticate a client (or the operator) from its bearer token."""
    known = service.credentials.known(token)
    if known is not None:
        return known
    return await run_in_threadpool(service.credentials.authenticate, token)


async def operator_caller(service: ServiceDep, token: TokenDep) -> None:
    """Require the operator token."""
    service.credentials.require_operator(token)


async def enrolment_shard(service: ServiceDep, token: TokenDep) -> Shard:
    """Require a shard enrolment token: the shard it enrols."""
    return service.credentials.enrolment(token)


CallerDep = Annotated[Caller, Depends(client_caller)]
OperatorDep = Annotated[None, Depends(operator_caller)]
EnrolmentDep = Annotated[Shard, Depends(enrolment_shard)]


async def _strict(request: Request, model: type[M]) -> M:
    """The JSON body validated again in strict mode: a number is never read from a string or
    a boolean (``[false]`` is not ``[0]``, ``"10"`` is not 10)."""
    try:
        return model.model_validate(await request.json(), strict=True)
    except ValidationError as err:
        errors: list[Any] = [
            {**e, "loc": ("body", *e["loc"])} for e in err.errors(include_url=False)
        ]
        raise RequestValidationError(errors) from None


async def strict_register(request: Request, body: RegisterRequest) -> RegisterRequest:
    """``POST /v1/clients`` body, strictly typed."""
    return await _strict(request, RegisterRequest)


async def strict_release(request: Request, body: ReleaseRequest) -> ReleaseRequest:
    """``POST /v1/clients/release`` body, strictly typed."""
    return await _strict(request, ReleaseRequest)


async def strict_evaluation(request: Request, body: EvaluationRequest) -> EvaluationRequest:
    """``POST /v1/evaluations`` body, strictly typed."""
    return await _strict(request, EvaluationRequest)


async def strict_item_counts(request: Request, body: ItemCountsRequest) -> ItemCountsRequest:
    """``POST /v1/runs/{run_id}/item-counts`` body, strictly typed."""
    return await _strict(request, ItemCountsRequest)


async def strict_run_config(request: Request, body: RunConfig) -> RunConfig:
    """``POST /v1/runs`` body, strictly typed."""
    return await _strict(request, RunConfig)


async def upload_body(request: Request) -> bytes:
    """The raw body, refused (415) unless sent as ``application/octet-stream`` and (413) as
    soon as it exceeds the configured limit."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != UPLOAD_MEDIA_TYPE:
        raise UnsupportedMediaType(
            f"an upload body is {UPLOAD_MEDIA_TYPE} (got {media_type or 'no Content-Type'})"
        )
    return await _bounded(request, request.app.state.settings.max_body_bytes)


async def _bounded(request: Request, limit: int) -> bytes:
    """The raw body, refused (413) as soon as it exceeds ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"body of {declared} bytes exceeds the limit of {limit}")
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge(f"body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


BodyDep = Annotated[bytes, Depends(upload_body)]

SECAGG_JSON = "application/json"


async def secagg_body(request: Request, step: SecAggStep) -> bytes:
    """A secure-aggregation body: a masked input as ``application/octet-stream``, every other
    step's JSON list as ``application/json`` (415 otherwise), bounded as uploads are (413; the
    JSON steps by the JSON limit, in the middleware)."""
    want = UPLOAD_MEDIA_TYPE if step in ("masked", "masked_b") else SECAGG_JSON
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != want:
        raise UnsupportedMediaType(
            f"a {step} body is {want} (got {media_type or 'no Content-Type'})"
        )
    limit: int = request.app.state.settings.max_body_bytes
    return await _bounded(request, limit)


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The documented refusals of a route: each an ErrorBody (a database outage is 503 with
    Retry-After on every route that reads or writes)."""
    out: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorBody} for code in (*codes, 413, 422)
    }
    out[503] = {
        "model": ErrorBody,
        "description": "The database is unavailable; retry after the Retry-After seconds.",
        "headers": {"Retry-After": {"schema": {"type": "integer"}}},
    }
    return out


ERRORS = _errors(401, 403, 404, 409, 410)
#: a route that reads a JSON body: also 415 for a body under another media type
JSON_ERRORS = _errors(401, 403, 404, 409, 410, 415)

UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "A wire.encode_updates body (safetensors): one or more clients' updates.",
        "content": {UPLOAD_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.post(
    "/v1/clients", status_code=status.HTTP_201_CREATED, responses=_errors(401, 403, 409, 415)
)
def register_clients(
    shard: EnrolmentDep,
    body: Annotated[RegisterRequest, Depends(strict_register)],
    service: ServiceDep,
) -> RegisterResponse:
    """Register clients of the enrolment token's shard under one credential: new ids, ids
    the operator released, or ids the body's own ``token`` holds already (409
    ``clients_held`` naming ids another credential holds)."""
    token, ids = service.credentials.register_clients(shard, body.client_ids, body.token)
    return RegisterResponse(token=token, client_ids=ids)


@router.post("/v1/clients/release", responses=_errors(401, 404, 415))
def release_clients(
    _: OperatorDep,
    body: Annotated[ReleaseRequest, Depends(strict_release)],
    service: ServiceDep,
) -> ReleaseResponse:
    """Release registered clients (operator): no credential holds them any more until an
    enrolment token of their shard registers them again (a worker that lost its store)."""
    return ReleaseResponse(released=service.credentials.release_clients(body.client_ids))


@router.get("/v1/clients/count", responses=_errors())
def count_clients(service: ServiceDep) -> dict[str, int]:
    """How many clients are registered (launchers wait on it before starting a run)."""
    return {"registered": service.credentials.count_clients()}


@router.get("/v1/rounds/current", responses=_errors(401))
def current_round(caller: CallerDep, service: ServiceDep) -> CurrentRound:
    """The current round, with the caller's cohort members."""
    return service.reads.current_round(caller)


def _model_response(blob: ModelBlob, if_none_match: str | None) -> Response:
    etag = f'"{blob.etag}"'
    headers = {"ETag": etag, MODEL_VERSION_HEADER: str(blob.version), "Cache-Control": "no-cache"}
    if if_none_match is not None:
        tags = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
        if etag in tags or "*" in tags:
            return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    return Response(content=blob.blob, media_type="application/octet-stream", headers=headers)


@router.get("/v1/models/latest", responses=ERRORS, response_class=Response)
def latest_model(
    caller: CallerDep,
    service: ServiceDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """The newest model version as safetensors (304 when the ETag matches)."""
    return _model_response(service.reads.model_blob(None), if_none_match)


@router.get("/v1/models/{version}", responses=ERRORS, response_class=Response)
def model_version(
    version: Version,
    caller: CallerDep,
    service: ServiceDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """One model version as safetensors (304 when the ETag matches)."""
    return _model_response(service.reads.model_blob(version), if_none_match)


@router.get("/v1/runs/{run_id}/models/{version}", responses=ERRORS, response_class=Response)
def run_model_version(
    run_id: RunId,
    version: Version,
    caller: CallerDep,
    service: ServiceDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """One model version of any run, an earlier one too, as safetensors (304 when the ETag
    matches)."""
    return _model_response(service.reads.model_blob(version, run_id), if_none_match)


@router.post(UPLOAD_PATH, responses={**ERRORS, **_errors(415)}, openapi_extra=UPLOAD_BODY)
def upload_updates(
    round_id: RoundId, caller: CallerDep, body: BodyDep, service: ServiceDep
) -> UploadResponse:
    """Validate and store one or more clients' updates (wire.encode_updates body); the body
    that closes the round is answered with the round after the close."""
    results, closed = service.ingest.accept_and_close(caller, round_id, body)
    current = service.reads.current_round(caller) if closed else None
    return UploadResponse(results=results, current=current)


@router.get("/v1/rounds/{round_id}/secagg", responses=ERRORS)
def secagg_round(round_id: RoundId, caller: CallerDep, service: ServiceDep) -> SecAggRound:
    """Secure aggregation: the round's phase and what the caller's clients need for it."""
    return service.secure.view(caller, round_id)


SECAGG_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "keys, shares, reveal, reveal_b: a JSON list of "
        "fedrecgel.secagg.messages documents; masked, masked_b: one encode_masked body "
        "(safetensors) or a batch of several clients' (encode_masked_batch), each client "
        "refused on its own.",
        "content": {
            SECAGG_JSON: {"schema": {"type": "array", "items": {"type": "object"}}},
            UPLOAD_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


@router.post(
    "/v1/rounds/{round_id}/secagg/{step}",
    responses={**ERRORS, **_errors(415)},
    openapi_extra=SECAGG_BODY,
)
def secagg_message(
    round_id: RoundId,
    step: SecAggStep,
    caller: CallerDep,
    body: Annotated[bytes, Depends(secagg_body)],
    service: ServiceDep,
) -> UploadResponse:
    """Secure aggregation: the caller's clients' messages of one step, checked and stored."""
    cfg = service.newest.get().config
    assert cfg is not None
    return UploadResponse(results=service.secure.submit(caller, round_id, step, body, cfg))


@router.post("/v1/evaluations", status_code=status.HTTP_202_ACCEPTED, responses=JSON_ERRORS)
def report_evaluation(
    caller: CallerDep,
    body: Annotated[EvaluationRequest, Depends(strict_evaluation)],
    service: ServiceDep,
) -> EvaluationAck:
    """Federated evaluation: metric sums over some clients for one version."""
    return service.evaluations.report(caller, body)


@router.post(
    "/v1/runs/{run_id}/item-counts", status_code=status.HTTP_202_ACCEPTED, responses=JSON_ERRORS
)
def report_item_counts(
    run_id: RunId,
    caller: CallerDep,
    body: Annotated[ItemCountsRequest, Depends(strict_item_counts)],
    service: ServiceDep,
) -> ItemCountsAck:
    """The popularity prior: how many of the listed clients hold each item, once a run."""
    return service.priors.report(caller, run_id, body)


def _prior_response(
    service: AggregatorService, run_id: int | None, if_none_match: str | None
) -> Response:
    """The prior's answer; a matching ETag is answered before the counts are read."""
    etag = prior_etag(service.priors.info(run_id, with_counts=False))
    if if_none_match == etag:
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers={"ETag": etag})
    info = service.priors.info(run_id)
    return Response(
        content=info.model_dump_json(),
        media_type="application/json",
        headers={"ETag": prior_etag(info)},
    )


@router.get(
    "/v1/runs/current/prior",
    responses={**ERRORS, 200: {"model": PriorInfo}},
    response_class=Response,
)
def current_prior(
    caller: CallerDep,
    service: ServiceDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """The current run's popularity prior: the clients' summed item counts once complete, and
    the weight chosen at the newest evaluated version (304 when the ETag matches)."""
    return _prior_response(service, None, if_none_match)


@router.get(
    "/v1/runs/{run_id}/prior",
    responses={**ERRORS, 200: {"model": PriorInfo}},
    response_class=Response,
)
def run_prior(
    run_id: RunId,
    caller: CallerDep,
    service: ServiceDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """A run's popularity prior (as ``/v1/runs/current/prior``)."""
    return _prior_response(service, run_id, if_none_match)


@router.get("/v1/rounds/{round_id}", responses=_errors(404))
def round_info(round_id: RoundId, service: ServiceDep) -> RoundInfo:
    """Public state of a round of the current run."""
    return service.reads.round_info(round_id)


@router.get("/v1/runs/current/history", responses=_errors())
def run_history(
    service: ServiceDep,
    after: Annotated[
        int, Query(ge=0, le=MAX_INT32, description="Only the rounds after this one.")
    ] = 0,
    limit: Annotated[
        int,
        Query(ge=1, le=MAX_HISTORY_LIMIT, description="The most rounds in the answer."),
    ] = DEFAULT_HISTORY_LIMIT,
) -> History:
    """The closed rounds of the current run after round ``after``, at most ``limit`` of them
    (``next_after``: where the next page starts, null at the newest round)."""
    return service.reads.history(after, limit)


@router.post("/v1/runs", status_code=status.HTTP_201_CREATED, responses=JSON_ERRORS)
def start_run(
    _: OperatorDep,
    config: Annotated[RunConfig, Depends(strict_run_config)],
    service: ServiceDep,
) -> RunStarted:
    """Start a run (operator)."""
    return service.runs.start_run(config)


@router.post("/v1/runs/current/pause", responses=ERRORS)
def pause_run(_: OperatorDep, service: ServiceDep) -> RunStatus:
    """Pause the active run (operator)."""
    return service.runs.pause_run()


@router.post("/v1/runs/current/resume", responses=ERRORS)
def resume_run(_: OperatorDep, service: ServiceDep) -> RunStatus:
    """Resume the paused run (operator)."""
    return service.runs.resume_run()


@router.post("/v1/runs/current/stop", responses=ERRORS)
def stop_run(_: OperatorDep, service: ServiceDep) -> RunStatus:
    """Stop the active run (operator)."""
    return service.runs.stop_run()


@router.get("/healthz", responses={503: {"model": Health}})
def healthz(service: ServiceDep) -> JSONResponse:
    """200 when the database answers (``degraded`` when a configured Redis does not: rounds
    still close), 503 when the database does not."""
    health = service.health.check()
    code = status.HTTP_503_SERVICE_UNAVAILABLE if health.status == "error" else status.HTTP_200_OK
    return JSONResponse(health.model_dump(), status_code=code)


@router.get("/metrics", response_class=Response)
def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
