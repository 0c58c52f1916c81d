"""The federation's web dashboard: a small service of its own (``python -m services.dashboard``)
that reads the aggregator, the workers' device APIs and recommend_api on the server side and
serves one page at ``/ui/`` (see docs/DASHBOARD.md)."""
