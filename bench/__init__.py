"""taskhook's benchmarks: ``python -m bench all`` (or one of its subcommands).

Every benchmark starts what it needs (a private redis-server, a throwaway
PostgreSQL database, uvicorn and Celery processes), drives it from a separate
load-generator process, stops what it started by pid, and writes
``bench/results/<name>.json`` and ``<name>.png``. Goals are ratios against
baselines measured side by side in the same run; see docs/performance.md.
"""
