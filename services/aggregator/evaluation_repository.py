"""The queries of federated evaluation (reports and the clients they cover), on one session:
the service owns the transactions, as for :class:`~services.aggregator.repository.Repository`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import Table, delete, func, insert, select
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.aggregator.models import Evaluation, EvaluationReport, ModelVersion
from services.aggregator.repository import chunks

#: the evaluations table, for Core statements (one row per client a report covers): the ORM's
#: per-row work cost more than the rows themselves
_EVALUATIONS: Table = Evaluation.__table__  # type: ignore[assignment]
_COVERAGE_COLUMNS = "run_id, version, client_id, report_id"


def _coverage_insert(paramstyle: str) -> str | None:
    """The insert of coverage rows as the driver takes it, rows as plain tuples: a Core
    executemany builds each row's parameters in Python, which for the hundreds of clients of a
    report cost more than the driver's insert (None for a style not written here)."""
    mark = {"qmark": "?", "format": "%s", "pyformat": "%s"}.get(paramstyle)
    if mark is None:
        return None
    return f"INSERT INTO {_EVALUATIONS.name} ({_COVERAGE_COLUMNS}) VALUES ({', '.join([mark] * 4)})"


class EvaluationRepository:
    """Queries over ``evaluation_reports`` and ``evaluations``."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def evaluated_clients(self, run_id: int, version: int, client_ids: Iterable[int]) -> set[int]:
        """Which of ``client_ids`` already reported for a version."""
        t = _EVALUATIONS
        conn, out = self.session.connection(), set[int]()
        for part in chunks(client_ids):
            where = (t.c.run_id == run_id, t.c.version == version, t.c.client_id.in_(part))
            out.update(int(c) for c in conn.execute(select(t.c.client_id).where(*where)).scalars())
        return out

    def add_evaluation(
        self,
        run_id: int,
        version: int,
        sums: dict[str, float],
        count: int,
        client_ids: Sequence[int],
        now: datetime,
    ) -> bool:
        """Store a report and mark its clients as covered, in a savepoint: False, and nothing
        stored, when a client was covered already (the unique constraint refused its row).
        Only then need the caller look up which ones (:meth:`evaluated_clients`)."""
        try:
            with self.session.begin_nested():
                report = EvaluationReport(
                    run_id=run_id, version=version, sums=sums, count=count, created_at=now
                )
                self.session.add(report)
                self.session.flush()
                conn, rid = self.session.connection(), report.id
                sql = _coverage_insert(conn.dialect.paramstyle)
                if sql is not None:
                    conn.exec_driver_sql(sql, [(run_id, version, c, rid) for c in client_ids])
                else:  # (a driver of another parameter style: the Core executemany)
                    keys = {"run_id": run_id, "version": version, "report_id": rid}
                    conn.execute(
                        insert(_EVALUATIONS), [{**keys, "client_id": c} for c in client_ids]
                    )
        except IntegrityError:
            return False
        return True

    def count_evaluated(self, run_id: int, version: int) -> int:
        """How many clients reported for a version."""
        stmt = (
            select(func.count())
            .select_from(Evaluation)
            .where(Evaluation.run_id == run_id, Evaluation.version == version)
        )
        return int(self.session.scalar(stmt) or 0)

    def evaluation_reports(
        self, run_id: int, version: int, limit: int | None = None
    ) -> list[EvaluationReport]:
        """Every report of a version (the first ``limit``), in the order they came."""
        stmt = select(EvaluationReport).where(
            EvaluationReport.run_id == run_id, EvaluationReport.version == version
        )
        return list(self.session.scalars(stmt.order_by(EvaluationReport.id).limit(limit)))

    def drop_coverage_of_evaluated(self, run_id: int) -> int:
        """Delete the per-client rows of every version of a run whose metrics are written
        (their reports are answered as ignored from then on, see
        :meth:`services.aggregator.evaluation.Evaluations.report`); how many."""
        evaluated = select(ModelVersion.version).where(
            ModelVersion.run_id == run_id, ModelVersion.metrics.is_not(None)
        )
        result = self.session.execute(
            delete(Evaluation)
            .where(Evaluation.run_id == run_id, Evaluation.version.in_(evaluated))
            .execution_options(synchronize_session=False)
        )
        assert isinstance(result, CursorResult)
        return int(result.rowcount)
