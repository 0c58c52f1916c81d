"""Prometheus metrics of one app instance (its own registry, so several apps can coexist)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class AggregatorMetrics:
    """Counters and histograms of rounds and uploads."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.rounds_closed = Counter(
            "fedrec_agg_rounds_closed",
            "Rounds closed into a new model version",
            registry=self.registry,
        )
        self.rounds_retried = Counter(
            "fedrec_agg_rounds_retried",
            "Round attempts that missed their quorum",
            registry=self.registry,
        )
        self.updates_accepted = Counter(
            "fedrec_agg_updates_accepted",
            "Client updates stored (duplicates excluded)",
            registry=self.registry,
        )
        self.updates_duplicate = Counter(
            "fedrec_agg_updates_duplicate",
            "Identical retries of stored updates",
            registry=self.registry,
        )
        self.updates_refused = Counter(
            "fedrec_agg_updates_refused",
            "Upload bodies refused, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.round_duration = Histogram(
            "fedrec_agg_round_duration_seconds",
            "Time from a round opening to its close",
            buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800),
            registry=self.registry,
        )
        self.close_seconds = Histogram(
            "fedrec_agg_round_close_seconds",
            "Time to aggregate and persist a round",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )
        self.stage_seconds = Histogram(
            "fedrec_agg_stage_seconds",
            "Wall seconds of one stage of an upload or a close: validate (decode and check a "
            "body), commit (its group-commit transaction, waiting included), aggregate (the "
            "strategy's sum and step), encode_model, publish (the version event)",
            ["stage"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry,
        )

        self.dp_epsilon = Gauge(
            "fedrec_agg_dp_epsilon",
            "Differential privacy spent by the run so far (epsilon at the run's delta)",
            registry=self.registry,
        )

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
