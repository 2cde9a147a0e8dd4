"""`dfo demo`'s second eval at T = 1: its request is the first one's with the sampling options, and its lines put
τ at T = 0 beside τ at T = 1 with the CI (pure; the full demo is run by hand, ./scripts/demo.sh)."""

from __future__ import annotations

from orchestrator.demo.operation import SAMPLED_DRAWS, SAMPLED_TEMPERATURE, temperature_table


def _results(taus: dict[str, float], sampled: bool) -> dict:
    drafters = {}
    for name, tau in taus.items():
        metrics: dict = {"tau_macro": tau, "conventions": {"zlab-2604": {"tau_macro": tau + 0.3, "exact": True}}}
        if sampled:
            metrics["sampled"] = {"draws": 12 * SAMPLED_DRAWS,
                                  "tau_macro": {"value": tau, "ci": [tau - 0.1, tau + 0.1]},
                                  "zlab_2604_tau_macro": {"value": tau + 0.2, "ci": [tau + 0.1, tau + 0.3]}}
        drafters[name] = {"metrics": metrics}
    settings = {"sampling": {"temperature": SAMPLED_TEMPERATURE, "top_p": 1.0, "top_k": 0,
                             "samples_per_prompt": SAMPLED_DRAWS, "draft_rule": "sampled"}} if sampled else {}
    return {"settings": settings, "drafters": drafters}


def test_the_demo_shows_tau_at_t0_beside_tau_at_t1():
    lines = temperature_table(_results({"ours": 4.23, "random": 1.0}, False),
                              _results({"ours": 2.1, "random": 1.0}, True))
    assert lines[0].startswith("τ at T=0 and at T=1, sampled rule (3 seeded draws per prompt")
    header, ours, rand = lines[1:]
    assert header.split() == ["drafter", "T=0", "τ", "T=1,", "sampled", "rule", "τ", "[CI]", "T=0", "zlab-2604", "τ",
                              "T=1,", "greedy", "rule", "zlab-2604", "τ", "[CI]", "draws"]
    assert ours.split()[:5] == ["ours", "4.23", "2.10", "[2.00,", "2.20]"] and ours.split()[-1] == "36"
    assert "4.53" in ours and "2.30 [2.20, 2.40]" in ours
    assert rand.split()[:2] == ["random", "1.00"]
