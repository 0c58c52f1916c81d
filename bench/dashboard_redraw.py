"""The dashboard page over a long history: the page's script before (every round redrawn on
each change: a row per round, every round on the charts) against now (only new or changed
rounds touched, the table and charts bounded), in one run, in the system's headless Chromium.

The dashboard service runs on loopback over a fake aggregator holding ``--rounds`` closed
rounds (``harness/dashboard.py``, as in the browser tests); the page is the same, only
``/ui/static/dashboard.js`` differs (the "before" script is read from git, ``--before-rev``).
For each script, alternately, ``--repeats`` times: a fresh page loads the whole history, then
``--updates`` times one round closes; the time of each is measured inside the page, from the
state answer's arrival to the first animation frame after the page was drawn (so layout of
what changed counts too). Writes ``bench/results/dashboard_redraw.json``.

    python -m bench.dashboard_redraw [--rounds 100000] [--updates 5] [--repeats 2]
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Annotated, Any

from bench.bench_cli import OutFile, Positive, opt
from harness.browser import LAPTOP, chromium
from harness.dashboard import FakeAggregator, round_row, served

ROOT = Path(__file__).resolve().parent.parent

OUT = ROOT / "bench" / "results" / "dashboard_redraw.json"
SCRIPT = ROOT / "services" / "dashboard" / "static" / "dashboard.js"

# the time from each 200 state answer to the first frame after the page showed it (ms)
TIMING = """(() => {
  window.drawTimes = [];
  let t0 = null;
  const fetch0 = window.fetch;
  window.fetch = async (...args) => {
    const resp = await fetch0(...args);
    if (String(args[0]).includes('/ui/api/state') && resp.status === 200) t0 = performance.now();
    return resp;
  };
  document.addEventListener('DOMContentLoaded', () => {
    new MutationObserver(() => {
      if (t0 === null) return;
      const start = t0;
      t0 = null;
      requestAnimationFrame(() => setTimeout(() => window.drawTimes.push(performance.now() - start)));
    }).observe(document.getElementById('conn'), {childList: true, characterData: true, subtree: true});
  });
})();"""

NEWEST = """() => { const c = Chart.getChart(document.getElementById('chart-metrics'));
  return c && c.data.labels.length ? c.data.labels[c.data.labels.length - 1] : null; }"""


def _until(page: Any, what: str, cond: str, arg: Any, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(cond, arg):
        if time.monotonic() > deadline:
            raise SystemExit(f"not within {timeout_s:.0f}s: {what}")
        time.sleep(0.05)


def one(browser: Any, url: str, agg: FakeAggregator, script: str, updates: int) -> dict[str, Any]:
    """Load the page with ``script``, then close ``updates`` rounds; the times (ms)."""
    context = browser.new_context(viewport=LAPTOP, bypass_csp=True)
    context.add_init_script(TIMING)
    context.route(
        "**/ui/static/dashboard.js",
        lambda route: route.fulfill(body=script, content_type="text/javascript"),
    )
    page = context.new_page()
    page.goto(url)
    n = len(agg.rounds)
    _until(page, "the whole history drawn", f"() => ({NEWEST})() === {n} && drawTimes.length", None)
    load = page.evaluate("drawTimes[drawTimes.length - 1]")
    times = []
    for _ in range(updates):
        seen = page.evaluate("drawTimes.length")
        agg.rounds.append(round_row(len(agg.rounds) + 1))
        n = len(agg.rounds)
        _until(
            page, "a new round drawn", f"(k) => ({NEWEST})() === {n} && drawTimes.length > k", seen
        )
        times.append(page.evaluate("drawTimes[drawTimes.length - 1]"))
    rows = page.evaluate("document.querySelectorAll('#versions-table tbody tr').length")
    points = page.evaluate(
        "Chart.getChart(document.getElementById('chart-metrics')).data.labels.length"
    )
    context.close()
    return {"load_ms": load, "update_ms": times, "table_rows": rows, "chart_points": points}


def main(
    rounds: Positive = 100_000,
    updates: int = 5,
    repeats: Positive = 2,
    before_rev: Annotated[str, opt("git revision of the 'before' script")] = "9b52d12",
    out: OutFile = OUT,
) -> None:
    rel = SCRIPT.relative_to(ROOT)
    scripts = {
        "before": subprocess.run(
            ["git", "show", f"{before_rev}:{rel}"], cwd=ROOT, check=True,
            capture_output=True, text=True,
        ).stdout,
        "after": SCRIPT.read_text(),
    }  # fmt: skip
    agg = FakeAggregator(rounds)
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in scripts}
    with served(agg) as url, chromium() as browser:
        for rep in range(repeats):
            for name, script in scripts.items():
                runs[name].append(one(browser, url, agg, script, updates))
                print(name, rep, json.dumps(runs[name][-1]), flush=True)

    def summary(name: str) -> dict[str, Any]:
        ups = [t for r in runs[name] for t in r["update_ms"]]
        return {
            "load_ms_median": statistics.median(r["load_ms"] for r in runs[name]),
            "update_ms_median": statistics.median(ups),
            "update_ms_max": max(ups),
            "table_rows": runs[name][-1]["table_rows"],
            "chart_points": runs[name][-1]["chart_points"],
            "runs": runs[name],
        }

    before, after = summary("before"), summary("after")
    result = {
        "rounds": rounds,
        "updates": updates,
        "repeats": repeats,
        "before_rev": before_rev,
        "before": before,
        "after": after,
        "update_speedup": before["update_ms_median"] / after["update_ms_median"],
        "load_speedup": before["load_ms_median"] / after["load_ms_median"],
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%d"),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("before", "after")}))


if __name__ == "__main__":
    from bench.bench_cli import run

    run(main)
