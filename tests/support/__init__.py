"""What the tests share, other than fixtures: a test imports its helpers from
here, never from a conftest or another test module. Fixtures stay in the
conftest.py of the folder whose tests use them, where pytest finds them.

Every layer:
    stores        the task store on SQLite or PostgreSQL (``Store``, ``TRUSTED``)
    deliveries    real fixture bodies, signed and dressed as their provider sends them
    scenarios     inbox and task-store states built with the service functions
    domain_errors one instance of every domain error
    brokers       the real Redis and RabbitMQ the suite runs on
    fake_redis    Redis in memory (fakeredis) behind taskhook's own Redis transport
    descriptors   the session's count of open file descriptors, which must not grow

In process (integration):
    feeds, runs   the worker's deliveries, and how a run is made and made to fail
    ingress       the ingress app's webhook routes (``Ingress``) and REST API (``Api``)
    console       the operator console with two workspaces (``Console``)
    cli           the ``taskhook`` CLI through click, and how to read its answers
    metrics       /metrics, parsed

Real processes (e2e, reliability):
    processes     Celery workers and the ingress as subprocesses, bounded waits
    browser       a headless Chromium watching for dialogs, errors, CSP violations
    stack         one reliability scenario's processes, and its scale
    services      private Redis and PostgreSQL servers, throwaway databases
    traffic       concurrent webhook traffic; invariants: the promises, by SQL
    proxy, hosts  a TCP proxy that cuts and delays; hosts in network namespaces
"""
