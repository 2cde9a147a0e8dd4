"""The eval plan (pure): drafter references, validation, relays, sharding, the payload command."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import parse_inventory
from orchestrator.evaluation.plan import EvalRequest, parse_drafter, plan_eval

INV = parse_inventory("""\
hosts:
  kpro6:
    address: kpro6
    workdir: /data/dfo
    paths: {checkpoints: /data/ckpt}
  ct129:
    address: ct129
    workdir: /srv/dfo
    paths: {checkpoints: /srv/ckpt}
    serve_url: http://127.0.0.1:30000/v1
  ct130:
    address: ct130
    workdir: /srv/dfo
""", Path("inventory.yaml"))


def request(**kw) -> EvalRequest:
    base = dict(hosts=["ct129"], target="/models/Qwen3.6-27B",
                drafters=[parse_drafter("ours=kpro6:/data/ckpt/step_20000.pt", INV),
                          parse_drafter("zlab=/models/Qwen3.6-27B-DFlash", INV)])
    base.update(kw)
    return EvalRequest(**base)


def test_drafter_references():
    assert parse_drafter("ours=kpro6:/c/s.pt", INV).host == "kpro6"
    local = parse_drafter("z=/m/zlab", INV)
    assert local.host is None and local.path == "/m/zlab"
    with pytest.raises(InputError, match="unknown host 'kpro7'"):
        parse_drafter("ours=kpro7:/c/s.pt", INV)
    with pytest.raises(InputError, match="expected NAME=\\[HOST:\\]PATH"):
        parse_drafter("/c/s.pt", INV)
    with pytest.raises(InputError, match="not an absolute path"):
        parse_drafter("ours=kpro6:ckpt/s.pt", INV)


def test_training_checkpoint_from_another_host_is_stripped_and_relayed():
    plan = plan_eval(request(), INV)
    (relay,) = plan.relays
    assert relay.source == "kpro6:/data/ckpt/step_20000.pt"
    assert relay.destination == "ct129:/srv/ckpt/dfo-relayed/kpro6/" and relay.strip
    assert relay.lands_at == "/srv/ckpt/dfo-relayed/kpro6/step_20000-weights"
    (job,) = plan.jobs
    assert job.drafters == {"ours": relay.lands_at, "zlab": "/models/Qwen3.6-27B-DFlash"}
    assert job.args[:3] == ["eval", "--target", "/models/Qwen3.6-27B"]
    assert "--shard" not in job.args and "{results}" in job.args
    # Inputs are checked where they live: the checkpoint on kpro6, the rest on ct129.
    assert plan.checks == {"ct129": ["/models/Qwen3.6-27B", "/models/Qwen3.6-27B-DFlash"],
                           "kpro6": ["/data/ckpt/step_20000.pt"]}
    no_strip = plan_eval(request(strip_optimizer=False), INV).relays[0]
    assert not no_strip.strip and no_strip.lands_at.endswith("/step_20000.pt")


def test_several_hosts_shard_the_prompts_and_each_gets_the_drafter():
    plan = plan_eval(request(hosts=["ct129", "ct130"], samples=10), INV)
    assert [j.shard for j in plan.jobs] == [(0, 2), (1, 2)]
    assert [j.args[j.args.index("--shard") + 1] for j in plan.jobs] == ["0/2", "1/2"]
    assert {r.dest_host for r in plan.relays} == {"ct129", "ct130"}
    # ct130 has no checkpoints dir: relays land under its workdir.
    assert plan.jobs[1].drafters["ours"].startswith("/srv/dfo/checkpoints/dfo-relayed/kpro6/")


def test_reference_server_uses_the_inventory_url():
    job = plan_eval(request(reference="server"), INV).jobs[0]
    assert job.args[job.args.index("--reference") + 1] == "http://127.0.0.1:30000/v1"
    with pytest.raises(InputError, match="no serve_url in the inventory for ct130"):
        plan_eval(request(hosts=["ct130"], reference="server"), INV)
    with pytest.raises(InputError, match="expected 'target', 'server', 'vllm', 'sglang' or an http"):
        plan_eval(request(reference="tgi"), INV)


def test_prompts_file_goes_under_a_content_name():
    plan = plan_eval(request(prompts="mine.jsonl"), INV, prompts_digest="ab" * 32)
    job = plan.jobs[0]
    assert job.prompts_upload == "/srv/dfo/inputs/prompts-abababababababab.jsonl"
    assert job.args[job.args.index("--prompts") + 1] == job.prompts_upload


@pytest.mark.parametrize("kw, message", [
    (dict(hosts=[]), "at least one --host"),
    (dict(hosts=["ct999"]), "unknown host 'ct999'"),
    (dict(target="models/x"), "absolute path"),
    (dict(drafters=[]), "at least one --drafter"),
    (dict(max_new_tokens=0), "--max-new-tokens"),
    (dict(hosts=["ct129", "ct130"], samples=1), "fewer than the 2 hosts"),
])
def test_bad_requests_are_refused(kw, message):
    with pytest.raises(InputError, match=message):
        plan_eval(request(**kw), INV)


def test_duplicate_drafter_names_are_refused():
    twice = [parse_drafter("a=/x", INV), parse_drafter("a=/y", INV)]
    with pytest.raises(InputError, match="used twice: a"):
        plan_eval(request(drafters=twice), INV)


def test_depth_and_diagnostic_options_reach_the_payload():
    job = plan_eval(request(diagnose=True, diagnose_samples=3, expect_p1=["ours=0.7"], tree_k=4, tree_budget=8,
                            reference="http://127.0.0.1:30000/v1", reference_model="qwen",
                            payload_args=["--reference-timeout=60"], threads=1), INV).jobs[0]
    args = job.args
    for flag, value in (("--diagnose-samples", "3"), ("--expect-p1", "ours=0.7"), ("--tree-k", "4"),
                        ("--tree-budget", "8"), ("--reference", "http://127.0.0.1:30000/v1"),
                        ("--reference-model", "qwen"), ("--threads", "1")):
        assert args[args.index(flag) + 1] == value, flag
    assert "--diagnose" in args and args[-1] == "--reference-timeout=60"


def _after(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_engine_vllm_passes_the_engine_venv_python_and_checks_it_first():
    inv = parse_inventory("""\
hosts:
  ct129:
    address: ct129
    workdir: /srv/dfo
    paths: {engine_venv: /opt/engines/vllm-cpu}
  ct130:
    address: ct130
    workdir: /srv/dfo
""", Path("inventory.yaml"))
    req = EvalRequest(hosts=["ct129", "ct130"], target="/models/t", drafters=[parse_drafter("z=/models/d", inv)],
                      engine="vllm", samples=4)
    plan = plan_eval(req, inv)
    assert plan.engine_pythons == {"ct129": "/opt/engines/vllm-cpu/bin/python",
                                   "ct130": "/srv/dfo/engines/vllm/bin/python"}  # paths.engine_venv or the default
    for job in plan.jobs:
        assert _after(job.args, "--engine") == ["vllm"]
        assert _after(job.args, "--engine-python") == [plan.engine_pythons[job.host]]
        assert "--reference" not in job.args  # references: the target's own greedy decoding
        assert plan.engine_pythons[job.host] in plan.checks[job.host]  # pre-flight: missing venv, clear error
    assert "engine_pythons" in plan.as_dict()
    sglang = plan_eval(EvalRequest(hosts=["ct130"], target="/models/t", drafters=[parse_drafter("z=/models/d", inv)],
                                   engine="sglang", engine_concurrency="1,16"), inv)
    (job,) = sglang.jobs  # each engine its own default venv: the two never overwrite each other
    assert _after(job.args, "--engine-python") == ["/srv/dfo/engines/sglang/bin/python"]
    assert _after(job.args, "--engine") == ["sglang"] and _after(job.args, "--engine-concurrency") == ["1,16"]


def test_reference_vllm_alone_and_with_the_engine():
    plan = plan_eval(request(reference="vllm", reference_model="ignored"), INV)
    (job,) = plan.jobs
    assert _after(job.args, "--reference") == ["vllm"] and "--engine" not in job.args
    assert _after(job.args, "--engine-python") == ["/srv/dfo/engines/vllm/bin/python"]
    assert "--reference-model" not in job.args  # the payload names the server it starts itself
    both = plan_eval(request(reference="vllm", engine="vllm"), INV).jobs[0].args
    assert _after(both, "--reference") == ["vllm"] and _after(both, "--engine") == ["vllm"]
    assert len(_after(both, "--engine-python")) == 1
    plain = plan_eval(request(), INV)
    assert plain.engine_pythons == {} and "--engine-python" not in plain.jobs[0].args


def test_unknown_engine_is_refused():
    with pytest.raises(InputError, match="--engine 'tgi': expected one of vllm, sglang"):
        plan_eval(request(engine="tgi"), INV)
    with pytest.raises(InputError, match="expected 'target', 'server', 'vllm', 'sglang' or an http"):
        plan_eval(request(reference="tgi"), INV)
