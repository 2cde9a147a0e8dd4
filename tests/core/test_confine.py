"""The confinement rule, on both sides: controller (core.confine) and host (host_prelude._confine)."""

from __future__ import annotations

import os

import pytest

from orchestrator.core.confine import check_component, confine
from orchestrator.core.errors import HostError
from orchestrator.transport.hostcall import PRELUDE

BAD = ["", "/etc/passwd", "../x", "a/../../x", "a//b", "a/./b", "a/", "x\x00y", ".", ".."]


def _host_confine():
    scope: dict = {}
    exec(compile(PRELUDE.read_text(), str(PRELUDE), "exec"), scope)
    return scope["_confine"]


@pytest.mark.parametrize("rel", BAD)
def test_bad_names_refused_on_both_sides(tmp_path, rel):
    with pytest.raises(HostError) as info:
        confine(tmp_path, rel, host="evil", what="file name")
    assert "evil" in str(info.value) and repr(rel) in str(info.value)
    with pytest.raises(RuntimeError, match="refused name"):
        _host_confine()(str(tmp_path), rel)


def test_good_names_resolve_under_root(tmp_path):
    assert confine(tmp_path, "a/b.txt", host="h") == tmp_path.resolve() / "a" / "b.txt"
    assert _host_confine()(str(tmp_path), "a/b.txt") == str(tmp_path.resolve() / "a" / "b.txt")


def test_symlink_inside_root_cannot_lead_out(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    os.symlink(outside, root / "link")
    with pytest.raises(HostError, match="outside"):
        confine(root, "link/x", host="h")
    with pytest.raises(RuntimeError, match="outside"):
        _host_confine()(str(root), "link/x")


def test_sibling_prefix_is_not_inside(tmp_path):
    # /x/root-evil starts with "/x/root" as a string but is not under it.
    (tmp_path / "root").mkdir()
    (tmp_path / "root-evil").mkdir()
    os.symlink(tmp_path / "root-evil", tmp_path / "root" / "l")
    with pytest.raises(RuntimeError, match="outside"):
        _host_confine()(str(tmp_path / "root"), "l/f")


@pytest.mark.parametrize("value", ["../x", "/abs", "a/b", "", "-rf", ".", "..", "a b", "x\x00", 7, "abc\n"])
def test_component_check(value):
    with pytest.raises(HostError, match="refused job id"):
        check_component(value, host="h", what="job id")
    assert check_component("20260101-abc_1.2", host="h", what="job id") == "20260101-abc_1.2"
