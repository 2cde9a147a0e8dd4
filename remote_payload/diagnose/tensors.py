"""Statistics of hidden states and fc outputs (``--diagnose``), and the checkpoint's embedding copies
against the target's."""

from __future__ import annotations

import math

from remote_payload.diagnose.findings import FP16_MAX, FP16_NAMES, Finding


class TensorStats:
    """Streaming mean / std / abs-max / NaN / inf count of every element of the tensors added."""

    def __init__(self):
        self.count = 0  # finite values
        self.sum = 0.0
        self.sumsq = 0.0
        self.abs_max = 0.0
        self.nan = 0
        self.inf = 0

    def add(self, t) -> None:
        import torch

        x = t.detach()
        if not x.is_floating_point():
            x = x.float()
        nan, inf = torch.isnan(x), torch.isinf(x)
        self.nan += int(nan.sum())
        self.inf += int(inf.sum())
        finite = x[~(nan | inf)].double()
        if finite.numel():
            self.count += finite.numel()
            self.sum += float(finite.sum())
            self.sumsq += float((finite * finite).sum())
            self.abs_max = max(self.abs_max, float(finite.abs().max()))

    @property
    def nonfinite(self) -> int:
        return self.nan + self.inf

    def to_json(self) -> dict:
        n = self.count
        mean = self.sum / n if n else None
        std = math.sqrt(max(0.0, self.sumsq / n - mean * mean)) if mean is not None else None
        rms = math.sqrt(self.sumsq / n) if n else None
        return {"mean": round_sig(mean), "std": round_sig(std), "rms": round_sig(rms),
                "abs_max": round_sig(self.abs_max if n else None), "nan": self.nan, "inf": self.inf,
                "values": n + self.nan + self.inf}


def round_sig(x, digits: int = 6):
    """x to `digits` significant digits (JSON stays readable); None stays None."""
    return None if x is None else float(f"{x:.{digits}g}")


def stats_findings(layer_stats: dict, dtype: str) -> list[Finding]:
    out = []
    bad = {lid: s for lid, s in layer_stats.items() if s.nonfinite}
    if bad:
        out.append(Finding("warning", "nonfinite-features", "the target's hidden states hold NaN/inf at layer(s) "
                           + ", ".join(f"{lid} ({s.nan} NaN, {s.inf} inf)" for lid, s in sorted(bad.items()))
                           + f" ({dtype}): the target's numerics are broken (fp16 overflow? a kernel fault?); every "
                           "draft built on them is noise"))
    big = sorted(lid for lid, s in layer_stats.items() if s.abs_max > FP16_MAX)
    if big:
        fp16 = dtype in FP16_NAMES
        out.append(Finding("warning" if fp16 else "info", "fp16-range",
                           f"hidden states at layer(s) {big} exceed float16's range ({FP16_MAX:g}): they overflow "
                           "in float16" + ("; this run IS float16" if fp16 else " (fine in bfloat16/float32)")))
    return out


def embedding_comparison(name: str, loaded, target) -> tuple[dict, list]:
    """The checkpoint's embed_tokens / lm_head copies against the target's, when the checkpoint has them."""
    import torch

    out: dict = {}
    findings: list[Finding] = []
    used = {"embed_tokens.weight": loaded.spec.embed_source, "lm_head.weight": loaded.spec.lm_head_source}
    pairs = (("embed_tokens.weight", target.model.get_input_embeddings().weight),
             ("lm_head.weight", target.model.get_output_embeddings().weight))
    for key, theirs in pairs:
        ours = loaded.extras.get(key)
        if ours is None:
            out[key] = None
            continue
        rows = None
        if key == "lm_head.weight" and loaded.spec.vocab_map == "d2t" and "d2t" in loaded.extras:
            d2t = loaded.extras["d2t"].to(torch.int64)
            rows = torch.arange(d2t.shape[0]) + d2t  # draft row i holds target row i + d2t[i]
        res = _compare_rows(ours, theirs, rows)
        res["used_by_the_eval"] = used[key] == "checkpoint"
        out[key] = res
        if not res["match"]:
            who = ("the drafter drafts with these copies" if res["used_by_the_eval"] else
                   "the eval uses the target's, but the drafter was trained next to these")
            findings.append(Finding("warning", "embedding-mismatch", f"the checkpoint's {key.split('.')[0]} differs "
                                    f"from the target's ({res['detail']}); {who}: trained against other target "
                                    "weights (another revision?) or the wrong target is loaded", name))
    return out, findings


def _compare_rows(ours, theirs, rows=None, chunk: int = 32768) -> dict:
    import torch

    theirs_rows = theirs.shape[0] if rows is None else None
    n = ours.shape[0] if rows is not None else min(ours.shape[0], theirs.shape[0])
    if ours.dim() != 2 or ours.shape[1] != theirs.shape[1]:
        return {"match": False, "shape": list(ours.shape), "target_shape": list(theirs.shape),
                "detail": f"shape {list(ours.shape)} vs {list(theirs.shape)}"}
    dev = theirs.device
    scale = max(float(theirs.detach()[i:i + chunk].abs().amax()) for i in range(0, theirs.shape[0], chunk))
    tol = max(1e-6, 1e-2 * scale)  # bf16 rounding of the same weights stays well inside 1% of the range
    max_diff, differing = 0.0, 0
    for start in range(0, n, chunk):
        a = ours[start:start + chunk].to(dev, torch.float32)
        idx = torch.arange(start, min(n, start + chunk)) if rows is None else rows[start:start + chunk]
        b = theirs.detach()[idx.to(dev)].float()
        d = (a - b).abs().amax(dim=1)
        max_diff = max(max_diff, float(d.max()))
        differing += int((d > tol).sum())
    shape_ok = rows is not None or ours.shape[0] == theirs_rows
    match = differing == 0 and shape_ok
    detail = (f"{differing} of {n} rows differ by more than {tol:.3g}, max |Δ| {max_diff:.3g}" if differing else
              f"max |Δ| {max_diff:.3g}")
    if not shape_ok:
        detail = f"{ours.shape[0]} rows vs the target's {theirs_rows}; over the common rows: {detail}"
    return {"match": match, "shape": list(ours.shape), "target_shape": list(theirs.shape), "max_abs_diff":
            round_sig(max_diff), "rows_differing": differing, "tolerance": round_sig(tol), "detail": detail}
