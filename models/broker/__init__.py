"""The broker side of taskhook: what travels between the ingress, the CLI and
the worker, and how it travels.

- ``messages``: the queues' and the messages' names, and how keys are cut
  into messages; the three processes meet only through these.
- ``redis_transport`` and ``filesystem_transport``: the kombu transports
  taskhook brings (Redis with one client per channel; the embedded broker
  writing each message whole).
- ``connection``: from the settings, the queues every process declares, the
  transport and its options, and the result backend.

It imports nothing of ``models`` but the settings: no table, session or
service, so a change to how messages travel stays in this folder.
"""
