"""Catching up on deliveries a provider logged but the inbox never stored (issue 17)."""
