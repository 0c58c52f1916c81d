"""Schema-driven fuzzing of a service's HTTP API with schemathesis, counted instead of raised.

:func:`fuzz` sends, for every operation of a service's OpenAPI document, ``max_examples``
requests generated from the schema (valid ones, then invalid ones) with one credential, and
checks each answer: no 5xx, and an answer the document describes (status code, content type,
headers, body schema). Nothing is raised on the way: every request is counted and every
failure is kept as a :class:`Finding` (the request as a curl command, the answer), so the tests
can assert that nothing was found and the benchmark can report how much was tried. Requests
go over real HTTP (to a server in a thread in the tests, to a server process in the benchmark).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import hypothesis
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Ok

# checks whose failure means "the answer is not what the document says": status code, content
# type, headers and body schema of the answer
CONFORMANCE_CHECKS = (
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
)
# an answer other than 4xx to a request the document says is invalid (lax coercion, say)
REJECTION_CHECK = "negative_data_rejection"
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
ANSWER_CHARS = 300
_DROPPED = "(no credential)"


@dataclass(frozen=True)
class Finding:
    """One failed check: where, with which credential, the request and the answer."""

    service: str
    operation: str
    token: str
    check: str  # "server_error", "transport_error" or a conformance check's name
    status: int | None
    request: str  # a curl command that reproduces it
    answer: str

    def line(self) -> str:
        """One line for a report."""
        return (
            f"{self.service} {self.operation} token={self.token} {self.check} "
            f"status={self.status}: {self.request} -> {self.answer}"
        )


@dataclass(repr=False)
class Tally:
    """What was tried and found for one service and one credential."""

    requests: int = 0
    server_errors: int = 0  # answers with a 5xx status
    violations: int = 0  # answers the document does not describe
    transport_errors: int = 0  # no answer: timeout, connection reset
    invalid_accepted: int = 0  # invalid requests answered with a success
    by_operation: dict[str, int] = field(default_factory=dict)
    by_status: dict[int, int] = field(default_factory=dict)  # answers by status code
    findings: list[Finding] = field(default_factory=list)

    def merge(self, other: Tally) -> None:
        """Add ``other``'s counts and findings to these."""
        self.requests += other.requests
        self.server_errors += other.server_errors
        self.violations += other.violations
        self.transport_errors += other.transport_errors
        self.invalid_accepted += other.invalid_accepted
        for label, n in other.by_operation.items():
            self.by_operation[label] = self.by_operation.get(label, 0) + n
        for status, n in other.by_status.items():
            self.by_status[status] = self.by_status.get(status, 0) + n
        self.findings += other.findings

    def __repr__(self) -> str:
        return (
            f"Tally(requests={self.requests}, server_errors={self.server_errors}, "
            f"violations={self.violations}, transport_errors={self.transport_errors}, "
            f"invalid_accepted={self.invalid_accepted}, by_status={self.by_status})"
        )

    def answered(self, low: int, high: int) -> int:
        """Answers with a status in ``[low, high)``."""
        return sum(n for status, n in self.by_status.items() if low <= status < high)

    @property
    def clean(self) -> bool:
        """Nothing found."""
        return not (
            self.server_errors or self.violations or self.transport_errors or self.invalid_accepted
        )

    def summary(self) -> dict[str, Any]:
        """Counts and (deduplicated) findings as JSON-ready data."""
        return {
            "requests": self.requests,
            "server_errors": self.server_errors,
            "schema_violations": self.violations,
            "transport_errors": self.transport_errors,
            "invalid_accepted": self.invalid_accepted,
            "operations": len(self.by_operation),
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
            "findings": [asdict(f) for f in unique(self.findings)],
        }

    def report(self, limit: int = 20) -> str:
        """The findings, one per line (deduplicated by operation and check)."""
        lines = [f.line() for f in unique(self.findings)]
        more = f"\n... and {len(lines) - limit} more" if len(lines) > limit else ""
        return "\n".join(lines[:limit]) + more


def unique(findings: Iterable[Finding]) -> list[Finding]:
    """The first finding of each (operation, token, check, status)."""
    seen: dict[tuple[str, str, str, int | None], Finding] = {}
    for f in findings:
        seen.setdefault((f.operation, f.token, f.check, f.status), f)
    return list(seen.values())


def load_schema(
    base_url: str, timeout_s: float = 30.0, headers: Mapping[str, str] | None = None
) -> schemathesis.BaseSchema:
    """The OpenAPI document a running service serves at ``/openapi.json`` (fetched with
    ``headers``, e.g. a credential the service asks for it)."""
    return schemathesis.openapi.from_url(
        f"{base_url}/openapi.json",
        timeout=timeout_s,
        wait_for_schema=timeout_s,
        headers=dict(headers or {}),
    )


def operation_labels(schema: schemathesis.BaseSchema) -> set[str]:
    """The labels (``"POST /v1/runs"``) of the operations of ``schema`` that can be fuzzed."""
    return {r.ok().label for r in schema.get_all_operations() if isinstance(r, Ok)}


def _answer(response: Any) -> str:
    text: str = response.content[:ANSWER_CHARS].decode("utf-8", errors="replace")
    return text + ("..." if len(response.content) > ANSWER_CHARS else "")


def _curl(case: schemathesis.Case[Any], base_url: str) -> str:
    try:
        return str(case.as_curl_command(base_url=base_url))
    except Exception as err:  # a request curl cannot express is still worth reporting
        return f"{case.method} {case.formatted_path} ({type(err).__name__})"


def fuzz(
    schema: schemathesis.BaseSchema,
    base_url: str,
    *,
    service: str,
    token: str,
    headers: Mapping[str, str] | None = None,
    max_examples: int = 25,
    modes: Iterable[GenerationMode] = MODES,
    seed: int | None = None,
    timeout_s: float = 10.0,
    include: Callable[[str], bool] | None = None,
    on_request: Callable[[str, int | None], None] | None = None,
) -> Tally:
    """Fuzz every operation of ``schema`` served at ``base_url`` with ``headers`` sent on every
    request (a credential under the name ``token``; None: no Authorization header at all, for
    the anonymous caller); ``include`` selects operations by label
    (``"POST /v1/runs"``). Returns the counts and findings; raises nothing for a finding.

    ``seed``: None sends the same requests on every call (tests); a seed draws another sample
    (the benchmark). ``on_request(label, status)`` is called after each request (status None
    when no answer came).
    """
    tally = Tally()
    # The anonymous caller's requests are generated with a fixed header too (generating header
    # values is slow and mostly rejected), which is removed before they are sent.
    fixed = dict(headers) if headers is not None else {"Authorization": _DROPPED}
    session = requests.Session()
    try:
        for result in schema.get_all_operations():
            if not isinstance(result, Ok):
                # an operation whose own schema is broken cannot be fuzzed: the document is wrong
                tally.violations += 1
                err = result.err()
                tally.findings.append(
                    Finding(service, str(err.path), token, "invalid_schema", None, "", str(err))
                )
                continue
            operation = result.ok()
            label = operation.label
            if include is not None and not include(label):
                continue
            for mode in modes:
                _fuzz_operation(
                    operation,
                    mode,
                    tally,
                    session=session,
                    base_url=base_url,
                    service=service,
                    token=token,
                    headers=fixed,
                    max_examples=max_examples,
                    seed=seed,
                    timeout_s=timeout_s,
                    on_request=on_request,
                )
    finally:
        session.close()
    return tally


def _fuzz_operation(
    operation: schemathesis.APIOperation[Any, Any, Any, Any],
    mode: GenerationMode,
    tally: Tally,
    *,
    session: requests.Session,
    base_url: str,
    service: str,
    token: str,
    headers: dict[str, str],
    max_examples: int,
    seed: int | None,
    timeout_s: float,
    on_request: Callable[[str, int | None], None] | None,
) -> None:
    label = operation.label
    # a fixed Authorization header replaces the one the document lets the fuzzer generate
    strategy = operation.as_strategy(generation_mode=mode, headers=headers)

    def record(check: str, status: int | None, case: schemathesis.Case[Any], answer: str) -> None:
        tally.findings.append(
            Finding(service, label, token, check, status, _curl(case, base_url), answer)
        )

    def one(case: schemathesis.Case[Any]) -> None:
        if case.headers and case.headers.get("Authorization") == _DROPPED:
            del case.headers["Authorization"]
        tally.requests += 1
        tally.by_operation[label] = tally.by_operation.get(label, 0) + 1
        try:
            response = case.call(base_url=base_url, session=session, timeout=timeout_s)
        except requests.RequestException as err:
            tally.transport_errors += 1
            record("transport_error", None, case, f"{type(err).__name__}: {err}"[:ANSWER_CHARS])
            if on_request is not None:
                on_request(label, None)
            return
        tally.by_status[response.status_code] = tally.by_status.get(response.status_code, 0) + 1
        if on_request is not None:
            on_request(label, response.status_code)
        if response.status_code >= 500:
            tally.server_errors += 1
            record("server_error", response.status_code, case, _answer(response))
        failed = False
        for name in CONFORMANCE_CHECKS:
            check = getattr(schemathesis.checks, name)
            try:
                case.validate_response(response, checks=[check])
            except FailureGroup as group:
                failed = True
                detail = "; ".join(f"{f.title}: {f.message}" for f in group.exceptions)
                record(name, response.status_code, case, f"{detail[:200]} | {_answer(response)}")
        if failed:
            tally.violations += 1
        if mode is GenerationMode.NEGATIVE:
            try:
                case.validate_response(
                    response, checks=[getattr(schemathesis.checks, REJECTION_CHECK)]
                )
            except FailureGroup as group:
                tally.invalid_accepted += 1
                detail = "; ".join(f"{f.title}: {f.message}" for f in group.exceptions)
                record(REJECTION_CHECK, response.status_code, case, f"{detail[:200]}")

    run = hypothesis.given(strategy)(one)
    run = hypothesis.settings(
        max_examples=max_examples,
        deadline=None,  # each request has its own timeout, counted as a transport error
        database=None,
        derandomize=seed is None,
        phases=[Phase.explicit, Phase.generate],  # nothing fails, so nothing to shrink
        suppress_health_check=list(HealthCheck),
        verbosity=hypothesis.Verbosity.quiet,
    )(run)
    if seed is not None:
        run = hypothesis.seed(seed)(run)
    # an operation without an invalid form has nothing to send in the negative mode
    with contextlib.suppress(hypothesis.errors.Unsatisfiable):
        run()


def to_json(tallies: Mapping[str, Tally]) -> str:
    """Tallies by credential as a JSON text."""
    return json.dumps({k: t.summary() for k, t in tallies.items()}, indent=2)
