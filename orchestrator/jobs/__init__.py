"""Detached remote jobs: launch, watch, reattach, cancel, pull (controller side and host script)."""
