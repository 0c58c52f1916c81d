"""The services' default ports are written once, in services/ports.py: settings, ``fedrec up``
and its options read them from there (port 8700 was written in seven places)."""

from __future__ import annotations

import re
from pathlib import Path

from services import ports

ROOT = Path(__file__).resolve().parents[1]


def test_each_default_port_is_written_only_in_the_ports_module() -> None:
    numbers = [ports.AGGREGATOR_PORT, ports.RECOMMEND_PORT, ports.DASHBOARD_PORT]
    numbers.append(ports.WORKER_HTTP_PORT)
    literal = re.compile(rf"(?<![\d.]){'|'.join(map(str, numbers))}(?![\d.])")
    home = ROOT / "services" / "ports.py"
    hits = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for folder in ("fedrecgel", "services")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != home
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if literal.search(line)
    ]
    assert hits == []
    assert literal.search(home.read_text())  # the pattern finds them where they are


def test_the_services_defaults_are_the_ports_modules() -> None:
    from services.aggregator.settings import Settings as AggregatorSettings
    from services.launcher import UpOptions

    assert AggregatorSettings.model_fields["port"].default == ports.AGGREGATOR_PORT
    opts = UpOptions()
    assert (opts.aggregator_port, opts.recommend_port) == (8700, 8702)
    assert (opts.dashboard_port, opts.worker_http_port) == (8704, 8710)
