"""taskhook's domain: tables, the external-ID contract, the task service, sessions.

Imports nothing else of ours; ``ingest`` and ``worker`` build on it.
"""
