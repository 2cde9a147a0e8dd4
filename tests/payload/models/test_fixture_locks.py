"""The fixture cache's locks: one per item, so two processes (here two threads, each with its own open file and
flock) build two different items side by side, and an item two of them ask for is built once. The builders are
stand-ins: what is under test is the locking in fixtures/build.py, not the models."""

from __future__ import annotations

import threading

import pytest

from remote_payload.fixtures import build as fx

WAIT_S = 20.0


@pytest.fixture
def stand_in_builders(monkeypatch, tmp_path):
    monkeypatch.setattr(fx, "default_cache_root", lambda: tmp_path / "cache")
    monkeypatch.setattr(fx, "DEPS", {})
    monkeypatch.setattr(fx, "WITH_PROGRESS", set())
    calls: list[str] = []
    a_started, b_started = threading.Event(), threading.Event()

    def build_a(out, deps):
        calls.append("a")
        a_started.set()
        assert b_started.wait(WAIT_S), "b never started while a was building: the builds were serialised"
        (out / "model").write_text("a")

    def build_b(out, deps):
        calls.append("b")
        b_started.set()
        assert a_started.wait(WAIT_S), "a never started while b was building"
        (out / "model").write_text("b")

    monkeypatch.setattr(fx, "BUILDERS", {"a": build_a, "b": build_b})
    monkeypatch.setattr(fx, "ALL", ["a", "b"])
    return calls


def _in_threads(*jobs):
    errors: list[BaseException] = []

    def run(fn, *args):
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * WAIT_S)
    assert not errors, errors


def test_two_items_build_side_by_side_and_each_copy_is_complete(stand_in_builders, tmp_path):
    _in_threads((fx.build, tmp_path / "one", ["a"]), (fx.build, tmp_path / "two", ["b"]))
    assert sorted(stand_in_builders) == ["a", "b"]
    assert (tmp_path / "one" / "a" / "model").read_text() == "a"
    assert (tmp_path / "two" / "b" / "model").read_text() == "b"


def test_an_item_two_processes_ask_for_is_built_once(stand_in_builders, tmp_path):
    # both ask for a and b: whichever gets a item's lock builds it, the other finds it built
    _in_threads((fx.build, tmp_path / "one", ["a", "b"]), (fx.build, tmp_path / "two", ["b", "a"]))
    assert sorted(stand_in_builders) == ["a", "b"]
    for out in ("one", "two"):
        assert {p.name for p in (tmp_path / out).iterdir() if p.is_dir()} == {"a", "b"}
