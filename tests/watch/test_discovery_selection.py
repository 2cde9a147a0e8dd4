"""Discovery (listing → checkpoints by step) and the round plan (settled, new, every N, newest): pure."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import HostError, InputError
from orchestrator.watch.discovery import parse_listing, step_from_name
from orchestrator.watch.selection import Options, plan_round

NOW = 1_000_000.0


def listing(*entries, now=NOW):
    return {"folder": "/data/run7", "now": now, "entries": list(entries)}


def parse(doc, **options):
    return parse_listing(doc, host="kpro6", folder="/data/run7", **options)


def f(name, size=100, age=3600.0):
    return {"name": name, "is_dir": False, "size": size, "mtime": NOW - age}


def d(name, meta=None, weights=True, age=3600.0):
    return {"name": name, "is_dir": True, "size": 500, "mtime": NOW - age, "has_weights": weights, "meta": meta}


@pytest.mark.parametrize("name,step", [("step_20000.pt", 20000), ("checkpoint-1500", 1500), ("global_step7.ckpt", 7),
                                       ("model_e3_1200.pt", 1200), ("ITER-0042.pth", 42), ("final.pt", None)])
def test_step_from_name(name, step):
    assert step_from_name(name) == step


def test_checkpoints_are_ordered_by_step_not_by_name_and_say_where_the_step_came_from():
    meta = {"file": "trainer_state.json", "step": 3000}
    doc = listing(f("step_1000.pt"), f("step_200.pt"), d("checkpoint-50"), d("final", meta=meta),
                  f("spec.json"), f("step_300.pt.dfo-partial"), f(".step_400.pt.tmp"), f("notes.txt"),
                  d("logs", weights=False))
    got = parse(doc)
    assert [(c.name, c.step) for c in got.checkpoints] == [("checkpoint-50", 50), ("step_200.pt", 200),
                                                           ("step_1000.pt", 1000), ("final", 3000)]
    assert [c.step_source for c in got.checkpoints] == ["name", "name", "name", "metadata:trainer_state.json"]
    assert got.checkpoints[1].path == "/data/run7/step_200.pt"


def test_pattern_and_step_source_options():
    doc = listing(f("step_100.pt"), f("ema_100.pt"), f("step_final.pt"))
    got = parse(doc, pattern="step_*.pt")
    assert [c.name for c in got.checkpoints] == ["step_100.pt"]
    assert got.ignored == [("step_final.pt", "no step in the name or metadata")]
    meta_only = parse(listing(d("run-5", meta={"file": "config.json", "step": 77})), step_from="metadata")
    assert [(c.step, c.step_source) for c in meta_only.checkpoints] == [(77, "metadata:config.json")]
    with pytest.raises(InputError, match="--step-from 'guess'"):
        parse(doc, step_from="guess")


def test_two_checkpoints_claiming_one_step_are_both_ignored_with_the_reason():
    got = parse(listing(f("step_100.pt"), f("ema_step_100.pt"), f("step_200.pt")))
    assert [c.name for c in got.checkpoints] == ["step_200.pt"]
    assert {n for n, why in got.ignored if "claimed by 2" in why} == {"step_100.pt", "ema_step_100.pt"}


def test_a_folder_that_cannot_be_listed_is_a_clear_error():
    with pytest.raises(InputError, match="kpro6: cannot list /nope: No such file"):
        parse({"folder": "/nope", "error": "cannot list /nope: No such file or directory"})


def test_paths_are_made_from_the_folder_dfo_asked_for_not_the_one_the_answer_names():
    doc = {**listing(f("step_100.pt")), "folder": "/home/u/.ssh"}
    assert [c.path for c in parse(doc).checkpoints] == ["/data/run7/step_100.pt"]


@pytest.mark.parametrize("name", ["step_7/", "step\x007.pt", "../step_7.pt", "a/step_7.pt", "/etc/step_7.pt", ".", "",
                                  7, None])
def test_a_name_that_is_no_folder_entry_is_refused_naming_the_host(name):
    with pytest.raises(HostError, match=r"kpro6: refused checkpoint name"):
        parse(listing(f("step_100.pt"), {**f("x"), "name": name}))


@pytest.mark.parametrize("doc,what", [
    ([], "the answer"), ({"now": NOW}, "the entries"), ({"entries": []}, "the host's clock"),
    (listing("step_1.pt"), "an entry"), (listing({**f("step_1.pt"), "size": "100"}), "the size"),
    (listing({**f("step_1.pt"), "size": -1}), "the size"), (listing({**f("step_1.pt"), "mtime": None}), "the mtime"),
    (listing({**f("step_1.pt"), "is_dir": "no"}), "is_dir"),
    (listing(d("ckpt", meta={"file": "/etc/passwd", "step": 3})), "the metadata step"),
    (listing(d("ckpt", meta={"file": "config.json", "step": "3"})), "the metadata step"),
    (listing(f("step_1.pt"), f("step_1.pt")), "a name listed twice"), ({"error": ["x"]}, "the error"),
])
def test_a_malformed_listing_is_a_host_error_naming_the_field(doc, what):
    with pytest.raises(HostError, match="kpro6: malformed folder listing from the host") as caught:
        parse(doc)
    assert what in caught.value.message


def entries(**status):
    return {name: {"name": name, "status": s, "observed": {"size": 100, "mtime": NOW - 3600}, "error": "bad zip",
                   "run": "r1"} for name, s in status.items()}


def test_only_settled_new_checkpoints_are_evaluated():
    doc = parse(listing(f("step_100.pt"), f("step_200.pt"), f("step_300.pt", age=2), f("step_400.pt", size=0)))
    plan = plan_round(doc, entries(**{"step_100.pt": "done"}), Options(settle=30))
    assert [c.name for c in plan.evaluate] == ["step_200.pt"]
    assert plan.done == 1
    assert [(c.name, why) for c, why in plan.waiting] == [
        ("step_300.pt", "written 2s ago; waiting for 30s of quiet"), ("step_400.pt", "empty so far")]


def test_in_flight_attempts_are_resumed_and_failures_retried_only_when_the_file_changed():
    doc = parse(listing(f("step_100.pt"), f("step_200.pt"), f("step_300.pt", size=999)))
    state = entries(**{"step_100.pt": "evaluating", "step_200.pt": "failed", "step_300.pt": "failed"})
    plan = plan_round(doc, state, Options(settle=0))
    assert [e["name"] for e in plan.reattach] == ["step_100.pt"]
    assert [c.name for c in plan.evaluate] == ["step_300.pt"]  # rewritten since it failed (other size)
    assert [(c.name, why) for c, why in plan.skipped] == [("step_200.pt", "failed before and unchanged since: bad zip")]
    relaying = plan_round(doc, entries(**{"step_100.pt": "relaying"}), Options(settle=0))
    assert [c.name for c in relaying.evaluate] == ["step_100.pt", "step_200.pt", "step_300.pt"]  # redone


def test_retry_failed_gives_a_failed_unchanged_checkpoint_n_more_attempts_then_skips_it():
    doc = parse(listing(f("step_100.pt"), f("step_200.pt"), f("step_300.pt")))
    state = entries(**{name: "failed" for name in ("step_100.pt", "step_200.pt", "step_300.pt")})
    for name, attempts in (("step_100.pt", 1), ("step_200.pt", 2), ("step_300.pt", 3)):
        state[name]["attempts"] = attempts
    plan = plan_round(doc, state, Options(settle=0, retry_failed=2))
    assert [c.name for c in plan.evaluate] == ["step_100.pt", "step_200.pt"]  # attempts 2 and 3 of 1 + 2
    assert [(c.name, why) for c, why in plan.skipped] == [
        ("step_300.pt", "failed before and unchanged since; its 2 retries are spent: bad zip")]
    assert plan_round(doc, state, Options(settle=0)).evaluate == []  # the default: no retry


def test_every_n_and_newest():
    doc = parse(listing(*(f(f"step_{s}.pt") for s in (500, 1000, 1500, 2000))))
    every = plan_round(doc, {}, Options(settle=0, every=1000))
    assert [c.step for c in every.evaluate] == [1000, 2000]
    assert [c.step for c, _ in every.skipped] == [500, 1500]
    newest = plan_round(doc, {}, Options(settle=0, newest=True))
    assert [c.step for c in newest.evaluate] == [2000]
    assert len(newest.skipped) == 3
    assert plan_round(doc, entries(**{"step_2000.pt": "done"}), Options(settle=0, newest=True)).evaluate == []


@pytest.mark.parametrize("kwargs,message", [({"settle": -1}, "--settle"), ({"every": 0}, "--every must"),
                                            ({"every": 2, "newest": True}, "exclude each other"),
                                            ({"retry_failed": -1}, "--retry-failed -1: expected 0 to 100")])
def test_bad_options_are_input_errors(kwargs, message):
    with pytest.raises(InputError, match=message):
        Options(**kwargs)
