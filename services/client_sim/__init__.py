"""Client-simulation workers: many users per process, private state in a local store.

``worker`` follows the rounds and runs the core's client round for its users; ``store`` keeps
their private state; ``aggregator_client`` is the outbound side (the aggregator's API),
``server`` and ``routes`` the inbound one (the device API); ``settings`` and ``waiters`` are
what both read. Entry points: ``services.client_sim.cli.main(argv)``
(``python -m services.client_sim``) and ``services.client_sim.worker.run_worker(settings)``.
"""
