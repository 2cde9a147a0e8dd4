"""Fast checks in the test venv (no triton here): the shim's bf16 rounding and the kernel policy."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import shim  # noqa: E402  (tests/fla_cpu/shim.py: its bf16 helpers need only numpy)

from remote_payload.errors import PayloadError  # noqa: E402
from remote_payload.models import kernels  # noqa: E402


def test_bf16_rounding_matches_torch_nearest_even():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(20000, generator=g) * 10 ** torch.randint(-30, 30, (20000,), generator=g),
                   # exact ties between two bf16 values: nearest-even must pick the even mantissa
                   torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 0.0, -0.0, float("inf"), 3.0e38])])
    want = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    got = shim.to_bits(x.numpy())
    assert np.array_equal(got, want)
    back = shim.from_bits(got)
    assert np.array_equal(back, x.to(torch.bfloat16).float().numpy())
    assert np.isnan(shim.round_bf16(np.array([np.nan], dtype=np.float32))).all()


def test_policy_fla_on_cpu_only_under_the_triton_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(PayloadError, match="--kernel fla needs a CUDA device"):
        kernels.apply_policy("cpu", "fla")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernels.apply_policy("cpu", "fla") == "fla"
    # auto stays torch on CPU even under the interpreter: only an explicit --kernel fla takes that path
    assert kernels.apply_policy("cpu", "auto") == "torch"
    assert kernels.apply_policy("cuda", "auto") == "fla"
    assert kernels.apply_policy("cuda", "torch") == "torch"
