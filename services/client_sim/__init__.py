"""Client-simulation workers: many users per process, private state in a local store.

Entry points: ``services.client_sim.cli.main(argv)`` (``python -m services.client_sim``) and
``services.client_sim.worker.run_worker(settings)``.
"""
