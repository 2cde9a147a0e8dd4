"""`--reference http://elsewhere` would send the API key in clear text: refused unless asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import parse_inventory
from orchestrator.evaluation.plan import EvalRequest, parse_drafter, plan_eval

INV = parse_inventory("""\
hosts:
  ct129: {address: ct129, workdir: /srv/dfo, serve_url: "http://10.1.2.3:30000/v1"}
  ct130: {address: ct130, workdir: /srv/dfo, serve_url: "http://127.0.0.1:30000/v1"}
""", Path("inventory.yaml"))


def _request(reference: str, host: str = "ct129", **kw) -> EvalRequest:
    return EvalRequest(hosts=[host], target="/models/t", drafters=[parse_drafter("z=/models/d", INV)],
                       reference=reference, **kw)


@pytest.mark.parametrize("url", ["http://10.1.2.3:30000/v1", "http://serve.example:80/v1", "server"])
def test_plain_http_elsewhere_is_refused(url):
    with pytest.raises(InputError, match="clear text") as info:
        plan_eval(_request(url), INV)
    assert "--allow-insecure-reference" in str(info.value)
    plan = plan_eval(_request(url, allow_insecure_reference=True), INV)
    assert "--reference" in plan.jobs[0].args


@pytest.mark.parametrize("url", ["https://serve.example/v1", "http://127.0.0.1:30000/v1", "http://localhost:8000/v1",
                                 "http://[::1]:8000/v1"])
def test_https_and_loopback_are_fine(url):
    assert plan_eval(_request(url), INV).jobs[0].args.count("--reference") == 1
    assert plan_eval(_request("server", host="ct130"), INV).jobs


def test_the_cli_flag_reaches_the_plan(tmp_path):
    from cli_runner import dfo

    inv = tmp_path / "inventory.yaml"
    inv.write_text("hosts:\n  ct129: {address: ct129, workdir: /srv/dfo, roles: [eval]}\n")
    proc = dfo("eval", "--host", "ct129", "--target", "/m/t", "--drafter", "z=/m/d", "--reference",
               "http://10.1.2.3:1/v1", inventory=inv, env={"DFO_REFERENCE_API_KEY": "k-4417"})
    assert proc.returncode == 2 and "clear text" in proc.stderr and "k-4417" not in proc.stderr + proc.stdout
