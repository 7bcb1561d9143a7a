"""Real servers that stand in for third-party services in tests (no mocks)."""
