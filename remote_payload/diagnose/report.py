"""The human side of ``--diagnose``: decoded rounds, the per-drafter record and the text report."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from remote_payload.diagnose.findings import AGREE_OK, BETTER_ABS, BETTER_REL, MIN_POSITIONS
from remote_payload.diagnose.probes import ProbeSample
from remote_payload.diagnose.tensors import TensorStats


def _piece(tokenizer, tid: int) -> str:
    return tokenizer.decode([int(tid)], skip_special_tokens=False)


def decoded_rounds(tokenizer, sample: ProbeSample, rounds, limit: int) -> dict:
    """The first ``limit`` chain rounds: the anchor, the eval's drafts and the target's tokens, decoded."""
    out = []
    tokens = sample.tokens
    for n, r in enumerate(rounds[:limit]):
        row = sample.as_run[r.anchor - sample.prompt_len].tolist()
        target = list(tokens[r.anchor + 1:r.anchor + 1 + len(row)])
        out.append({"round": n + 1, "anchor": r.anchor, "anchor_token": _piece(tokenizer, tokens[r.anchor]),
                    "accepted": r.accepted, "produced": r.produced, "drafts": row, "target": target,
                    "drafts_text": [_piece(tokenizer, t) for t in row],
                    "target_text": [_piece(tokenizer, t) for t in target]})
    return {"sample": sample.sample_id, "rounds": out}


@dataclass
class DrafterDiagnostics:
    name: str
    spec: Any
    fc_pre_norm: TensorStats = field(default_factory=TensorStats)
    fc_output: TensorStats = field(default_factory=TensorStats)
    metadata: dict | None = None
    mask: dict | None = None
    embeddings: dict | None = None
    probes: dict | None = None
    drafts: list = field(default_factory=list)
    p1: dict | None = None

    def add_fc(self, runtime, features) -> None:
        import torch

        with torch.inference_mode():
            pre = runtime.model.fc(runtime.fc_input(features))
            self.fc_pre_norm.add(pre)
            self.fc_output.add(runtime.model.hidden_norm(pre))

    def to_json(self) -> dict:
        s = self.spec
        return {"format": s.format, "block_size": s.block_size, "fc_layer_ids": list(s.fc_layer_ids),
                "reserved_layer_ids": list(s.reserved_layer_ids), "layer_ids_source": s.layer_ids_source,
                "attention": [{"kind": a.kind, "window": a.window, "causal": a.causal} for a in s.attn],
                "weights_dtype": s.weights_dtype, "training_metadata": self.metadata, "mask": self.mask,
                "fc_output": self.fc_output.to_json(), "fc_pre_norm": self.fc_pre_norm.to_json(),
                "embeddings": self.embeddings, "p1": self.p1, "probes": self.probes, "drafts": self.drafts}


def _fmt(x, spec: str = ".4g") -> str:
    return "–" if x is None else format(x, spec)


def _stats_row(label: str, st: dict) -> str:
    return (f"  {label:>8}  {_fmt(st['mean'], '>10.4g')}  {_fmt(st['std'], '>10.4g')}  {_fmt(st['abs_max'], '>10.4g')}"
            f"  {st['nan']:>5}  {st['inf']:>5}")


def render_text(diag: dict) -> str:
    """The readable report (printed at the end of the run and kept as diagnostics["text"])."""
    lines = [f"dfo diagnostics — {len(diag['samples'])} sample(s) probed: {', '.join(diag['samples']) or 'none'}"]
    findings = diag.get("findings") or []
    lines += ["", "Findings" + ("" if findings else ": none")]
    for f in findings:
        lines.append(f"  {f['severity'].upper():<7} [{f['code']}] " + (f"'{f['drafter']}': " if f["drafter"] else "")
                     + f["message"])
    hs = diag.get("hidden_states") or {}
    lines += ["", f"Target hidden states (decoder-layer outputs; {hs.get('samples')} sample(s), {hs.get('positions')} "
              f"positions, {hs.get('dtype')}, kernel path {hs.get('kernel_path')})",
              f"  {'layer':>8}  {'mean':>10}  {'std':>10}  {'abs-max':>10}  {'nan':>5}  {'inf':>5}"]
    for lid, st in (hs.get("layers") or {}).items():
        lines.append(_stats_row(str(lid), st))
    for name, d in (diag.get("drafters") or {}).items():
        lines += ["", *_drafter_lines(name, d), *_probe_lines(d), *_draft_lines(d)]
    lines += ["", "Probe rule: a variant is flagged when its depth-1 accuracy is >= "
              f"{BETTER_ABS:g} above and >= {BETTER_REL:g}x the design's block (slot0=token) over >= {MIN_POSITIONS} "
              f"positions; the eval's drafts must agree with slot0=token at >= {AGREE_OK:.0%}."]
    return "\n".join(lines)


def _drafter_lines(name: str, d: dict) -> list[str]:
    """A drafter's facts: format, mask token, attention, metadata, fc statistics, embeddings, p1."""
    mask = d.get("mask") or {}
    lines = [f"Drafter '{name}' ({d['format']}, block {d['block_size']}, fc layers {d['fc_layer_ids']}"
             + (f", reserved {d['reserved_layer_ids']}" if d["reserved_layer_ids"] else "")
             + f", weights {d['weights_dtype']})",
             f"  mask id {mask.get('id')}" + (f" = {mask['piece']!r}" if mask.get("piece") is not None else "")
             + f": {mask.get('kind')}; in the eval's text {mask.get('occurrences_in_text')} time(s)",
             "  attention: " + ", ".join(f"{a['kind'].split('_')[0]}"
                                         + (f"(window {a['window']})" if a["window"] else "")
                                         + ("/causal" if a["causal"] else "/bidirectional")
                                         for a in d["attention"]),
             f"  training metadata: {json.dumps(d['training_metadata']) if d['training_metadata'] else 'none'}",
             f"  {'fc':>8}  {'mean':>10}  {'std':>10}  {'abs-max':>10}  {'nan':>5}  {'inf':>5}",
             _stats_row("fc(x)", d["fc_pre_norm"]), _stats_row("normed", d["fc_output"])]
    for key, res in (d.get("embeddings") or {}).items():
        label = key.split(".")[0]
        if res is None:
            lines.append(f"  {label}: from the target (no copy in the checkpoint)")
        else:
            lines.append(f"  {label}: checkpoint copy {'matches' if res['match'] else 'DIFFERS FROM'} the target's "
                         f"({res['detail']}){'; used for drafting' if res.get('used_by_the_eval') else ''}")
    p1 = d.get("p1")
    if p1:
        lines.append(f"  position-1 acceptance {_fmt(p1.get('measured'), '.3f')}"
                     + (f", expected {p1['expected']:.3f} ({p1['expected_source']})" if p1.get("expected")
                        else " (no expected value: --expect-p1 or training.expected_p1)"))
    return lines


def _probe_lines(d: dict) -> list[str]:
    probes = (d.get("probes") or {}).get("variants") or {}
    if not probes:
        return []
    lines = ["  probes (re-drafted blocks; depth-1 accuracy, mean accepted, agreement with the eval's drafts):"]
    for label, v in probes.items():
        extra = f"  layers {v['layers']}" if "layers" in v else ""
        if "piece" in v and v["piece"] is not None:
            extra = f"  {v['piece']!r}"
        agree = v.get("agreement_with_as_run")
        lines.append(f"    {label:<22} {_fmt(v['depth1_accuracy'], '>6.3f')}  "
                     f"{_fmt(v['mean_accepted'], '>6.3f')}  {'' if agree is None else format(agree, '>7.1%')}"
                     f"{extra}")
    for what in (d.get("probes") or {}).get("not_applicable") or []:
        lines.append(f"    not probed (DFlash2): {what}")
    return lines


def _draft_lines(d: dict) -> list[str]:
    lines = []
    for smp in d.get("drafts") or []:
        lines.append(f"  first rounds of {smp['sample']} ([drafts] in brackets differ from the target's token):")
        for r in smp["rounds"]:
            lines.append(f"    round {r['round']} @ {r['anchor']} after {r['anchor_token']!r}: accepted "
                         f"{r['accepted']}/{len(r['drafts'])}")
            marks = zip(r["drafts_text"], _oks(r["drafts"], r["target"]), strict=True)
            lines.append("      draft : " + " ".join(_mark(t, ok) for t, ok in marks))
            lines.append("      target: " + " ".join(repr(t) for t in r["target_text"]))
    return lines


def _oks(drafts, target):
    return [i < len(target) and d == target[i] for i, d in enumerate(drafts)]


def _mark(text: str, ok: bool) -> str:
    return repr(text) if ok else f"[{text!r}]"
