"""Test and demo support: real sshd sandbox hosts, cached test venvs. Product code paths never import this
(only `dfo demo`).

The sandbox (import it from ``orchestrator.testing.sandbox``): ``sandbox`` orchestrates start/stop;
``host`` one host and its naming rule; ``network`` namespaces, veths, subnets, links, ports; ``sshd`` the
sshd processes; ``host_files`` keys and config/known_hosts/inventory text; ``processes`` PIDs (never
names); ``state`` ROOT/sandbox.json and ``down``; ``sandbox`` is also the command
``python -m orchestrator.testing.sandbox up|down ROOT``.

``venvs``: the virtual environments the tests build once and reuse (the vLLM engine venv, the fla venv).
"""
