"""orchestrator/testing/venvs.py: a test venv is built once, checked, marked last, and built again when its key
changed or its build never finished (a tiny local wheel stands in for the engine and fla stacks)."""

from __future__ import annotations

import pytest
from provision_helpers import make_wheel

from orchestrator.testing import venvs

CHECK = "import dfo_probe_venv; print('probe', dfo_probe_venv.VERSION)"


@pytest.fixture
def recipe(tmp_path):
    wheel, _ = make_wheel(tmp_path / "wheels", "dfo_probe_venv", "1.0")

    def make(key: str = "k1", check: str = CHECK, refresh=None) -> venvs.VenvRecipe:
        return venvs.VenvRecipe(path=tmp_path / "cache" / "probe-venv", key=key, base_python=venvs.base_python(),
                                install=("--no-deps", str(wheel)), check=check, refresh=refresh)

    return make


def test_built_once_then_reused_and_refreshed_at_every_use(recipe):
    refreshed = []
    python, built = venvs.ensure_venv(recipe(refresh=refreshed.append))
    assert built["status"] == "built" and built["checked"] == "probe 1.0" and python.exists()
    (python.parents[1] / "mine").write_text("kept")
    again_python, again = venvs.ensure_venv(recipe(refresh=refreshed.append))
    assert again["status"] == "reused" and again_python == python and (python.parents[1] / "mine").exists()
    assert refreshed == [python.parents[1]] * 2


def test_another_key_or_an_unfinished_build_is_built_again(recipe):
    python, _ = venvs.ensure_venv(recipe())
    (python.parents[1] / "mine").write_text("from the first build")
    _, other = venvs.ensure_venv(recipe(key="k2"))
    assert other["status"] == "built" and not (python.parents[1] / "mine").exists()
    (python.parents[1] / venvs.MARKER).unlink()  # as a build stopped before its marker
    _, rebuilt = venvs.ensure_venv(recipe(key="k2"))
    assert rebuilt["status"] == "built"


def test_a_venv_failing_its_check_is_removed_and_never_marked(recipe):
    bad = recipe(check="import sys; sys.exit('torch is not the +cpu build')")
    with pytest.raises(venvs.VenvBuildError, match=r"(?s)failed its check.*torch is not the \+cpu build"):
        venvs.ensure_venv(bad)
    assert not bad.path.exists()
    _, good = venvs.ensure_venv(recipe())
    assert good["status"] == "built"
