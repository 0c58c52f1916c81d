"""Client-simulation workers: many users per process, private state in a local store.

``worker`` takes a round's steps, running the core's client round for its users, and
``loop`` follows the rounds with it; ``store`` keeps their private state;
``aggregator_client`` is the outbound side (the aggregator's API), ``server`` and ``routes``
the inbound one (the device API); ``settings`` and ``waiters`` are what both read. Entry
points: ``services.client_sim.cli.main(argv)`` (``python -m services.client_sim``) and
``services.client_sim.loop.run_worker(settings)``.
"""
