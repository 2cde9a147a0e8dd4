"""Acceptance metrics and their statistics. Pure Python (no torch): the controller imports some of these."""
