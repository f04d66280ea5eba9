"""Judging a point: statistics, checks, reconciliation with the server, client fidelity, re-judging."""
