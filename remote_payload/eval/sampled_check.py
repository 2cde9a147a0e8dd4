"""``--online-check`` at T > 0 (the ``online:NAME`` stage): the real loop must give the offline expectation.

At T = 0 the online loop must reproduce the offline rounds exactly (``drafters.online_check``). At T > 0 the
loop draws its own continuation, so a per-draw comparison means nothing; what must hold is that the two
estimate one expectation. Per draw of the offline eval, the April z-lab loop (``online.online_generate`` with
``rule="zlab-2604"``: target tokens drawn at every block slot from the verify forward, greedy drafts, accept while
equal) runs on the same prompt with its own seed (``draw_seed(..., purpose="online")``); its rounds give the
draw's zlab-2604 τ directly and its committed τ by capping its rounds at the kept tokens (the committed rounds over
the same output). The offline and online τ per draw, in both conventions, are compared paired by prompt
(``metrics.sampled.expectation_agreement``: a two-sample test at a 1% false-alarm rate).

Under ``--draft-rule sampled`` the loop is the sampled-rule one (``online_generate(draft_rule="sampled")``: drafts
drawn from the drafter's law, rejection sampling) with the committed count, and it is compared with the
sampled-rule estimate per draw (``eval/sampled_rule.py``); the zlab-2604 count belongs to the greedy rule's loop and is
not checked there.
"""

from __future__ import annotations

from remote_payload.eval.context import EvalContext
from remote_payload.eval.online import online_generate
from remote_payload.inputs.sampling import draw_seed
from remote_payload.metrics.chain import Round, sample_tau
from remote_payload.metrics.sampled import online_summary


def committed_from_zlab_2604(rounds: list[Round], prompt_len: int, kept: int) -> list[Round]:
    """The committed convention's rounds from a zlab-2604-rule run over the same output (``kept`` = its tokens):
    every round anchored before the last kept token, capped at the tokens left after its anchor."""
    last = prompt_len + kept - 1
    out = []
    for r in rounds:
        if r.anchor >= last:
            break
        left = last - r.anchor
        out.append(Round(r.anchor, min(r.accepted, left), min(r.accepted + 1, left), left))
    return out


def sampled_online_check(ctx: EvalContext, name: str, source) -> None:
    """One online run per offline draw; ``ctx.results[name].online`` per draw and ``summary["online_check"]``."""
    s, run, refs, progress = ctx.settings, ctx.results[name], ctx.references.refs, ctx.progress
    stage = f"online:{name}"
    progress.stage_start(stage)
    out = []
    sampled_rule = run.sampled_rule is not None
    for i, ref in enumerate(refs):
        seed = draw_seed(s.seed, ref.prompt_ids, ctx.draws[i].number, "online")
        if sampled_rule:
            res = online_generate(ctx.target, source, ref.prompt_ids, s.max_new_tokens, sampling=s.sampling,
                                  seed=seed, draft_rule="sampled")
            taus = {"tau": sample_tau(res.rounds), "zlab_2604_tau": None}
        else:
            res = online_generate(ctx.target, source, ref.prompt_ids, s.max_new_tokens, rule="zlab-2604",
                                  sampling=s.sampling, seed=seed)
            committed = committed_from_zlab_2604(res.rounds, res.prompt_len, len(res.continuation))
            taus = {"tau": sample_tau(committed), "zlab_2604_tau": sample_tau(res.rounds)}
        out.append({"seed": seed, **taus,
                    "continuation_tokens": len(res.continuation), "stop_reason": res.stop_reason,
                    "seconds": round(res.seconds, 3), "target_forwards": res.target_forwards})
        progress.progress(stage, i + 1, len(refs), unit="samples", message=ctx.prompts[i].id)
    seconds = progress.stage_done(stage)
    run.online = out
    clusters = [d.prompt_index for d in ctx.draws]
    if sampled_rule:
        offline = [e["tau"] for e in run.sampled_rule or []]
        offline_var: list | None = [e.get("tau_var") for e in run.sampled_rule or []]
        offline_april: list = [None] * len(out)
    else:
        offline = [sample_tau(r) for r in run.rounds]
        offline_var = None
        offline_april = [sample_tau(rounds_of(c)) for c in (run.conventions or [])] or [None] * len(out)
    run.summary["online_check"] = online_summary(offline, offline_april, out, clusters, seconds,
                                                 rule="sampled" if sampled_rule else "greedy", offline_var=offline_var)
    run.summary["timings"]["online_s"] = round(seconds, 3)
    for convention, verdict in run.summary["online_check"]["agreement"].items():
        if verdict.get("agree") is False:
            ctx.warn(f"online check for '{name}' at {s.sampling.label()}: the online loop's expected τ "
                     f"({convention}) {verdict['online_tau']:.3f} and the offline estimate "
                     f"{verdict['offline_tau']:.3f} differ by {verdict['difference']:+.3f}, beyond the bound "
                     f"±{verdict['bound']:.3f} ({verdict['rule']})")


def rounds_of(record: dict) -> list[Round]:
    """A stored zlab-2604 record's rounds (anchors are not needed for τ)."""
    april = record["zlab-2604"]
    return [Round(-1, a, p, -1) for a, p in zip(april["accepted"], april["produced"], strict=True)]
