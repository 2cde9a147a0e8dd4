"""The eval options, declared once (remote_payload/eval/options.py): bad values are refused on the controller
before anything connects, and the commands, the request, the payload's argv, parser and settings cannot drift
from the declaration."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import pytest
import typer
from cli_runner import dfo

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import parse_inventory
from orchestrator.evaluation.plan import EvalRequest, parse_drafter, plan_eval
from remote_payload.cli import build_parser
from remote_payload.errors import PayloadError
from remote_payload.eval import options as declared
from remote_payload.eval.settings import EvalSettings, check_values, settings_from_values

# Every host is unreachable (port 1): a case that gets past the checks would fail to connect (exit 1), so
# exit 2 with the case's phrase shows the value was refused before any connection.
INVENTORY = """hosts:
  kpro6: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-k, roles: [train], paths: {checkpoints: /tmp/ck}}
  ct129: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-c, roles: [eval]}
  ct130: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-d, roles: [eval]}
"""
NO_EVAL_ROLE = """hosts:
  kpro6: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-k, roles: [train]}
"""
BASE = ["eval", "--host", "ct129", "--target", "/m/t", "--drafter", "ours=kpro6:/ck/step_1.pt", "--drafter", "z=/m/d"]


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    inv = tmp_path / "inventory.yaml"
    inv.write_text(INVENTORY)
    no_eval = tmp_path / "no-eval.yaml"
    no_eval.write_text(NO_EVAL_ROLE)
    a, b = '{"id": "a", "prompt": "x"}\n', '{"id": "b", "prompt": "y"}\n'
    prompts = {"bad-line": a + '{"id": "b"}\n', "not-json": '{"id": "a", "prompt": \n', "empty": "\n",
               "twice": a + a, "one": a, "good": a + b}
    out = {"inventory": inv, "no-eval": no_eval}
    for name, text in prompts.items():
        out[name] = tmp_path / f"{name}.jsonl"
        out[name].write_text(text)
    return out


# (case, extra arguments, exit code, a phrase of the message). {name} is a file of the fixture.
BAD_EVAL = [
    ("dtype fp32", ["--dtype", "fp32"], 2, "--dtype 'fp32': expected one of bfloat16, float32, float16"),
    ("dtype float16", ["--dtype", "float16"], 2, "--dtype float16 is refused"),
    ("expect-p1 abc", ["--expect-p1", "abc"], 2, "--expect-p1 'abc': 'abc' is not a number"),
    ("expect-p1 1.5", ["--expect-p1", "1.5"], 2, "must be in (0, 1]"),
    ("expect-p1 unknown drafter", ["--expect-p1", "zz=0.5"], 2, "--expect-p1 for unknown drafter name(s): zz"),
    ("tree-k 0", ["--tree-k", "0"], 2, "--tree-k 0: expected an integer of at least 1"),
    ("tree-k abc", ["--tree-k", "abc"], 2, "Invalid value for '--tree-k'"),
    ("tree-budget 0", ["--tree-budget", "0"], 2, "--tree-budget 0: expected an integer of at least 1"),
    ("threads 0", ["--threads", "0"], 2, "--threads 0: expected an integer of at least 1"),
    ("samples 0", ["--samples", "0"], 2, "--samples 0: expected an integer of at least 1"),
    ("max-new-tokens 0", ["--max-new-tokens", "0"], 2, "--max-new-tokens 0: expected an integer of at least 1"),
    ("diagnose-samples 0", ["--diagnose-samples", "0"], 2, "--diagnose-samples 0"),
    ("device tpu", ["--device", "tpu"], 2, "--device 'tpu': expected one of auto, cuda, cpu"),
    ("engine tgi", ["--engine", "tgi"], 2, "--engine 'tgi': expected one of vllm, sglang"),
    ("engine bad release", ["--engine", "vllm@../x"], 2, "--engine 'vllm@../x': expected NAME@VERSION"),
    ("engine release of tgi", ["--engine", "tgi@1.0"], 2, "--engine 'tgi@1.0': expected one of vllm, sglang"),
    ("reference tgi", ["--reference", "tgi"], 2, "expected 'target', 'server', 'vllm', 'sglang' or an http"),
    ("engine-concurrency 0", ["--engine-concurrency", "1,0"], 2, "every level must be at least 1 request"),
    ("engine-concurrency twice", ["--engine-concurrency", "4,4"], 2, "--engine-concurrency '4,4': a level is given"),
    ("payload-arg unknown", ["--payload-arg=--bogus"], 2, "`remote_payload eval` has no option --bogus"),
    ("payload-arg typo", ["--payload-arg=--reference-timout=3"], 2, "(did you mean --reference-timeout?)"),
    ("payload-arg of dfo", ["--payload-arg=--tree-k=3"], 2, "give it as dfo's own --tree-k"),
    ("payload-arg dfo sets", ["--payload-arg=--out=/x"], 2, "--out is not for --payload-arg: dfo sets it itself"),
    ("payload-arg bad value", ["--payload-arg=--reference-timeout=abc"], 2, "invalid float value: 'abc'"),
    ("payload-arg out of range", ["--payload-arg=--reference-timeout=0"], 2,
     "--reference-timeout 0.0: expected a number above 0"),
    ("payload-arg no option", ["--payload-arg=bare"], 2, "expected an option of the payload, --NAME"),
    ("prompts bad line", ["--prompts", "{bad-line}"], 2, "bad-line.jsonl line 2: needs \"messages\""),
    ("prompts not json", ["--prompts", "{not-json}"], 2, "not-json.jsonl line 1: not valid JSON"),
    ("prompts empty", ["--prompts", "{empty}"], 2, "holds no prompts"),
    ("prompts duplicate id", ["--prompts", "{twice}"], 2, "duplicate id(s) a"),
    ("prompts missing", ["--prompts", "/nonexistent/p.jsonl"], 2, "no such local file"),
    ("prompts fewer than hosts", ["--prompts", "{one}", "--host", "ct130"], 2,
     "the prompt set's 1 prompt(s) is fewer than the 2 hosts"),
    ("unknown host", ["--host", "zz"], 2, "unknown host 'zz'"),
    ("relative target", ["--target", "m/t"], 2, "--target 'm/t': expected an absolute path"),
    ("bad drafter", ["--drafter", "nothing"], 2, "expected NAME=[HOST:]PATH"),
]


def _args(args: list[str], files: dict[str, Path]) -> list[str]:
    return [a.format(**{k: str(v) for k, v in files.items()}) for a in args]


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
@pytest.mark.parametrize("case, extra, code, phrase", BAD_EVAL, ids=[c[0] for c in BAD_EVAL])
def test_bad_eval_input_is_refused_before_anything_connects(files, tmp_path, case, extra, code, phrase, dry_run):
    proc = dfo(*BASE, *_args(extra, files), *(["--dry-run"] if dry_run else []), inventory=files["inventory"],
               runs=tmp_path / "runs")
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert phrase in " ".join(proc.stderr.split()), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()


def test_the_same_checks_pass_what_is_right(files, tmp_path):
    """The positive side of the table: forced fp16, a good prompts file, payload options with their values."""
    proc = dfo(*BASE, "--dtype", "float16", "--payload-arg=--allow-fp16", "--prompts", str(files["good"]),
               "--payload-arg=--reference-timeout", "--payload-arg=30", "--payload-arg=--engine-arg=--x=1",
               "--engine", "vllm", "--expect-p1", "ours=0.6", "--threads", "1", "--dry-run", "--json",
               inventory=files["inventory"])
    assert proc.returncode == 0, proc.stderr
    (job,) = json.loads(proc.stdout)["plan"]["jobs"]
    args = job["args"]
    assert args[args.index("--dtype") + 1] == "float16" and "--allow-fp16" in args
    assert args[args.index("--threads") + 1] == "1" and args[args.index("--expect-p1") + 1] == "ours=0.6"
    assert args[-4:] == ["--allow-fp16", "--reference-timeout", "30", "--engine-arg=--x=1"]
    assert job["prompts_upload"].startswith("/tmp/dfo-c/inputs/prompts-")


def test_host_defaults_to_the_inventory_eval_hosts(files):
    proc = dfo("eval", "--target", "/m/t", "--drafter", "z=/m/d", "--dry-run", "--json", inventory=files["inventory"])
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)["plan"]
    assert plan["request"]["hosts"] == ["ct129", "ct130"] and [j["shard"] for j in plan["jobs"]] == [[0, 2], [1, 2]]
    none = dfo("eval", "--target", "/m/t", "--drafter", "z=/m/d", "--dry-run", inventory=files["no-eval"])
    assert none.returncode == 2 and "Traceback" not in none.stderr
    assert "no --host given, and no host in" in none.stderr and "roles: [eval]" in none.stderr


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
@pytest.mark.parametrize("host", ["ct129", "kpro6"], ids=["eval host", "drafter's host"])
def test_an_unset_env_reference_of_a_host_the_eval_uses_is_refused_before_anything_connects(files, tmp_path, host,
                                                                                          dry_run):
    unset = "DFO_TEST_SURELY_UNSET_EVAL_VAR"
    text = files["inventory"].read_text().replace(f"  {host}: {{", f"  {host}: {{env: {{TOKEN: '${{{unset}}}'}}, ")
    inventory = tmp_path / "env-inventory.yaml"
    inventory.write_text(text)
    proc = dfo(*BASE, *(["--dry-run"] if dry_run else []), inventory=inventory, runs=tmp_path / "runs")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{host}: env TOKEN refers to ${{{unset}}}, which is not set" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------ drift


INV = parse_inventory(INVENTORY, Path("inventory.yaml"))


def _defaults(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def test_the_request_holds_exactly_the_declared_options_with_their_defaults():
    fields = {f.name for f in dataclasses.fields(EvalRequest)}
    declared_fields = {o.field for o in declared.request_options()}
    assert fields - {"hosts", "drafters"} == declared_fields
    defaults = _defaults(EvalRequest)
    for o in declared.request_options():
        if o.required:
            assert o.field not in defaults, o.flag
        else:
            assert defaults[o.field] == o.request_default, o.flag


def test_the_settings_are_the_declared_payload_options_with_their_defaults():
    produced = declared.settings_values({})
    assert set(produced) == {f.name for f in dataclasses.fields(EvalSettings)}
    defaults = _defaults(EvalSettings)
    for name, value in produced.items():
        if name in defaults:
            assert defaults[name] == value, name


def test_the_payload_parser_is_the_declaration():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices["eval"]
    actions = {a.option_strings[0]: a for a in parser._actions if a.option_strings and a.dest != "help"}
    assert list(actions) == [o.flag for o in declared.payload_options()]
    for o in declared.payload_options():
        a = actions[o.flag]
        assert a.dest == o.field and a.help and a.required == o.required, o.flag
        assert tuple(a.choices or ()) == o.choices, o.flag
        if not o.required and not o.repeatable:
            assert a.default == o.default, o.flag


@pytest.mark.parametrize("command", [declared.EVAL, declared.WATCH])
def test_the_commands_offer_every_declared_option_with_help(command):
    import importlib

    from orchestrator.cli.main import app

    importlib.import_module(f"orchestrator.cli.{command}_cmd")
    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    params = {p.opts[0]: p for p in cmd.params if p.param_type_name == "option"}
    for o in declared.offered(command):
        p = params[o.flag]
        assert p.name == o.field and p.help, o.flag
        assert p.default == o.request_default or (p.default in (None, ()) and o.request_default in (None, [])), o.flag
        assert p.multiple == o.repeatable and p.required == o.required, o.flag
    no_help = [name for name, p in params.items() if not p.help]
    assert not no_help, f"options without help: {no_help}"
    assert "As for dfo eval" not in " ".join(p.help or "" for p in params.values())


def _non_default(o: declared.Option):
    """A value of the option that is not its default and that the payload accepts."""
    if o.kind is bool:
        return not o.request_default if o.request_default is not None else True
    if o.choices:
        return next(c for c in o.choices if c != o.request_default and c != "float16")
    if o.kind is int:
        return 3
    if o.kind is float:
        return 0.5
    if o.field == "expect_p1":
        return ["ours=0.5"]
    if o.field == "engine_concurrency":
        return "1,4"
    if o.field == "engine_k":
        return "1,3"
    if o.field == "engine_check":
        return "synthetic"
    if o.field == "decode_batch":
        return "8"
    return ["--x"] if o.repeatable else "x"


def test_every_request_value_reaches_the_payload_settings_unchanged():
    """request → plan → the payload's own parser → EvalSettings: each option arrives with the value given."""
    skip = {"target", "prompts", "reference", "reference_model", "engine", "payload_args",  # planned: below
            "datasets", "suite", "dataset_files",  # real sets: tests/evaluation/test_dataset_options.py
            "selection", "selection_concurrency",  # they need a dataset: test_selection_reaches_the_payload below
            "protocol",  # it fixes a dataset: test_a_protocol_fills_the_options_left_at_their_default below
            "card", "explain"}  # a card fixes its protocol, --explain needs one: tests/cards/test_card_options.py
    given = {o.field: _non_default(o) for o in declared.request_options() if o.payload and o.field not in skip}
    assert given, "no option to carry"
    req = EvalRequest(hosts=["ct129"], target="/m/t", drafters=[parse_drafter("ours=/m/d", INV)], **given,
                      reference="http://127.0.0.1:9/v1", reference_model="qwen", engine="vllm")
    (job,) = plan_eval(req, INV).jobs
    settings = settings_from_values(vars(build_parser().parse_args(job.args)))
    for field, value in given.items():
        o = declared.BY_FIELD[field]
        assert getattr(settings, field) == (o.parse(value) if o.parse else value), field
    assert settings.target == "/m/t" and settings.drafters == [("ours", "/m/d")] and settings.out == "{results}"
    assert settings.reference_url == "http://127.0.0.1:9/v1" and settings.reference_model == "qwen"
    assert settings.engine == "vllm" and settings.engine_python == "/tmp/dfo-c/engines/vllm/bin/python"


def test_selection_reaches_the_payload_and_is_refused_without_a_dataset():
    req = EvalRequest(hosts=["ct129"], target="/m/t", drafters=[parse_drafter("ours=/m/d", INV)],
                      datasets=["humaneval@8"], selection="zlab-server", selection_concurrency=4)
    (job,) = plan_eval(req, INV).jobs
    settings = settings_from_values(vars(build_parser().parse_args(job.args)))
    assert (settings.selection, settings.selection_concurrency) == ("zlab-server", 4)
    with pytest.raises(InputError, match="--selection zlab-server needs --dataset NAME or --suite zlab: it chooses"):
        plan_eval(EvalRequest(hosts=["ct129"], target="/m/t", drafters=[parse_drafter("ours=/m/d", INV)],
                              selection="zlab-server"), INV)
    with pytest.raises(InputError, match="--selection-concurrency 4 needs --selection zlab-server: it is the server"):
        plan_eval(EvalRequest(hosts=["ct129"], target="/m/t", drafters=[parse_drafter("ours=/m/d", INV)],
                              datasets=["humaneval@8"], selection_concurrency=4), INV)


def test_a_watch_series_keeps_every_watch_option_that_changes_the_figures(tmp_path):
    from orchestrator.watch.config import WatchConfig

    cfg = WatchConfig(series="s", source_host="kpro6", folder="/ck/run", runs_dir=tmp_path,
                      request=EvalRequest(hosts=["ct129"], target="/m/t", drafters=[]))
    kept = set(cfg.settings())
    for o in declared.offered(declared.WATCH):
        assert (o.field in kept) == o.compared, o.flag
    assert {"seed", "prompts_sha256", "pattern", "step_from"} <= kept


def test_the_dry_run_names_the_engine_it_plans(files):
    proc = dfo("eval", "--target", "/m/t", "--drafter", "z=/m/d", "--engine", "sglang", "--dry-run",
               inventory=files["inventory"])
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "SGLang engine inside the job" in out and "`dfo provision --host HOST --engine sglang`" in out
    assert "one SGLang server per drafter (z)" in out and "vLLM" not in out


def test_a_protocol_fills_the_options_left_at_their_default_and_refuses_a_conflicting_one():
    """--protocol zlab-card-gsm8k-t1: the card's measurement in one flag, on the controller as on the host."""
    base = dict(hosts=["ct129"], target="/m/t", drafters=[parse_drafter("ours=/m/d", INV)],
                protocol="zlab-card-gsm8k-t1", dataset_files=["gsm8k=/data/gsm8k-test.jsonl"])
    (job,) = plan_eval(EvalRequest(**base), INV).jobs
    s = settings_from_values(vars(build_parser().parse_args(job.args)))
    assert (s.datasets, s.selection, s.selection_concurrency) == (["gsm8k@128"], "zlab-server", 1)
    assert (s.temperature, s.top_p, s.top_k, s.enable_thinking, s.max_new_tokens, s.draft_rule) == (
        1.0, 0.95, 20, True, 4096, "sampled")
    assert s.protocol == "zlab-card-gsm8k-t1"
    same = EvalRequest(**base, temperature=1.0, top_k=20)  # given with the protocol's own values: fine
    plan_eval(same, INV)
    with pytest.raises(InputError, match=r"--protocol zlab-card-gsm8k-t1 fixes what it measures, but --temperature "
                                         r"0.6 \(the protocol: 1\); --draft-rule greedy \(the protocol: sampled\)"):
        plan_eval(EvalRequest(**base, temperature=0.6, draft_rule="greedy"), INV)


def test_a_pinned_engine_release_plans_its_own_venv_and_reaches_the_payload_split():
    req = EvalRequest(hosts=["ct129"], target="/m/t", drafters=[parse_drafter("ours=/m/d", INV)], engine="vllm@0.31.0")
    (job,) = plan_eval(req, INV).jobs
    assert job.args[job.args.index("--engine") + 1] == "vllm@0.31.0"
    assert job.args[job.args.index("--engine-python") + 1] == "/tmp/dfo-c/engines/vllm@0.31.0/bin/python"
    settings = settings_from_values(vars(build_parser().parse_args(job.args)))
    assert (settings.engine, settings.engine_version) == ("vllm", "0.31.0")
    (job,) = plan_eval(dataclasses.replace(req, engine="vllm"), INV).jobs
    settings = settings_from_values(vars(build_parser().parse_args(job.args)))
    assert (settings.engine, settings.engine_version) == ("vllm", None)
    assert job.args[job.args.index("--engine-python") + 1] == "/tmp/dfo-c/engines/vllm/bin/python"


# A value for each option that only means something with another: alone, each is refused on both sides.
ALONE = {"selection": "zlab-server", "selection_concurrency": 4, "top_p": 0.9, "top_k": 5, "samples_per_prompt": 3,
         "engine_concurrency": "1,4", "engine_k": "1,3", "engine_check": "synthetic",
         "engine_args": ["--tensor-parallel-size=2"]}


def test_every_option_that_needs_another_is_refused_alone_by_the_payload_and_by_dfo():
    needing = [o for o in declared.OPTIONS if o.needs is not None]
    assert {o.field for o in needing} == set(ALONE), "give each option with `needs` a value in ALONE"
    for o in needing:
        phrase = f"{o.flag} {ALONE[o.field] if not isinstance(ALONE[o.field], list) else ALONE[o.field][0]} " \
                 f"needs {o.needs.flag}: {o.needs.why}"
        value = ALONE[o.field]
        argv = ["eval", "--target", "/m/t", "--drafter", "a=/m/d",
                *[f"{o.flag}={v}" for v in (value if isinstance(value, list) else [value])]]
        settings = settings_from_values(vars(build_parser().parse_args(argv)))
        with pytest.raises(declared.PayloadError, match=re.escape(phrase)):
            check_values(settings)
        if o.field not in {f.name for f in dataclasses.fields(EvalRequest)}:
            continue  # --engine-arg: dfo passes it with --payload-arg, so the payload's check above is dfo's too
        with pytest.raises(InputError) as refused:
            plan_eval(EvalRequest(hosts=["ct129"], target="/m/t", drafters=[parse_drafter("ours=/m/d", INV)],
                                  **{o.field: value}), INV)
        assert phrase in refused.value.message
    # with what it needs, each is accepted
    plan_eval(EvalRequest(hosts=["ct129"], target="/m/t", drafters=[parse_drafter("ours=/m/d", INV)],
                          engine="vllm", engine_k="1,3", engine_concurrency="1,4"), INV)


def test_enable_thinking_both_reaches_the_payload_and_is_refused_with_a_server(files):
    """`dfo eval --enable-thinking both` (typer's flags take no value: flag_words turns it into the hidden flag),
    its payload argv and the payload's parse; the bare and --no- forms keep their meaning; a server is refused."""
    for given, expected in ((["--enable-thinking", "both"], "both"), (["--enable-thinking=both"], "both"),
                            (["--enable-thinking"], True), (["--no-enable-thinking"], False)):
        proc = dfo(*BASE, *given, "--dry-run", "--json", inventory=files["inventory"])
        assert proc.returncode == 0, proc.stderr
        (job,) = json.loads(proc.stdout)["plan"]["jobs"]
        assert settings_from_values(vars(build_parser().parse_args(job["args"]))).enable_thinking == expected, given
    assert declared.flag_words(["--enable-thinking", "both", "--", "--enable-thinking", "both"]) == [
        "--enable-thinking-both", "--", "--enable-thinking", "both"]
    proc = dfo(*BASE, "--enable-thinking", "both", "--engine", "vllm", "--dry-run", inventory=files["inventory"])
    assert proc.returncode == 2 and "--enable-thinking both with --engine vllm" in proc.stderr, proc.stderr
    with pytest.raises(PayloadError, match="--enable-thinking 'sometimes': expected no value"):
        build_parser().parse_args(["eval", "--target", "t", "--drafter", "a=b", "--enable-thinking", "sometimes"])


def test_longctx_depths_reach_the_payload_and_bad_ones_are_refused_before_anything_connects():
    req = EvalRequest(hosts=["ct129"], target="/m/t", drafters=[parse_drafter("ours=/m/d", INV)],
                      datasets=["longctx:4k,16k@2"])
    (job,) = plan_eval(req, INV).jobs
    settings = settings_from_values(vars(build_parser().parse_args(job.args)))
    assert [s.depths for s in settings.dataset_specs] == [(4096, 16384)]
    with pytest.raises(InputError, match="depth '4q' is not a token count"):
        plan_eval(dataclasses.replace(req, datasets=["longctx:4q"]), INV)
