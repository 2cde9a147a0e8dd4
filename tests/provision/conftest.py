"""Fixtures shared by the provision tests (payload and engine venvs)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def local_wheels(tmp_path, monkeypatch) -> Path:
    """pip (wheelhouse builds) sees only this folder: no index, no network."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder
