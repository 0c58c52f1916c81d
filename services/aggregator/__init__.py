"""The aggregator service: rounds, uploads, aggregation and versioned models over HTTP."""
