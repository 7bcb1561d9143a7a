"""Real servers that stand in for third-party APIs (GitHub's, Jira's), for the tests and
the benchmarks alike: real sockets, the published response shapes, no mocks."""
