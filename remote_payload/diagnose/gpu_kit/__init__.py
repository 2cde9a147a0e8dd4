"""The GPU check kit: one prepared run of the GPU path (``scripts/gpu-check.sh``), or its toy-size CPU smoke.

Four steps, each its own process under its own time limit (the script's), each writing its figures to a
part file as they come, so a step that overruns or fails leaves the others' figures and its own partial ones:

- ``env``: the GPU, its driver, the library versions next to the payload's CUDA pins, a bf16 matmul rate;
- ``fla``: the payload's eval of the tiny hybrid fixture with ``--kernel fla`` on real Triton kernels, and the
  per-layer fla-vs-torch table in fp32 and bf16 set beside the figures Triton's CPU interpreter gives
  (``data/cpu_interpreter_figures.json``, recorded with the tests' shim);
- ``kernel_path``: τ of a drafter trained on fla-bf16 features, evaluated on fla bf16 / torch bf16 / torch fp32
  features, with bootstrap CIs (``kernel_path.py``);
- ``cost``: the real size: a random bf16 target built on the device from Qwen3.6-27B's configuration and a random
  drafter from its DFlash configuration (``data/``), extraction and decode rates and peak memory at 2,048-token
  samples, the drafter eval's rates (chain and DDTree-8), feature bytes per token; ``merge`` projects the z-lab
  suite's wall time and cache size from them (``projection.py``).

``python -m remote_payload.diagnose.gpu_kit step NAME --part FILE [--smoke]`` runs one step;
``... merge --parts DIR --out FILE.json --md FILE.md`` assembles what the steps left.
"""
