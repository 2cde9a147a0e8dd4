"""What `dfo eval` will do, decided from the request and the inventory alone (pure: no I/O).

The plan is what `--dry-run` prints and what `operation.py` executes: which hosts get the payload and a
venv, which drafters are relayed (and stripped of optimizer state) to which eval host, and the exact
payload command each eval host runs on its shard of the prompts.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import Inventory
from orchestrator.relay.plan import strip_dir_name

TRAINING_CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")
ENGINES = ("vllm",)  # serving engines the payload can start on the eval host
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
RELAY_SUBDIR = "dfo-relayed"


@dataclass(frozen=True)
class DrafterRef:
    name: str
    host: str | None  # None: the path is on the eval host(s)
    path: str

    @property
    def is_training_checkpoint(self) -> bool:
        return self.path.endswith(TRAINING_CHECKPOINT_SUFFIXES)

    def label(self) -> str:
        return f"{self.name}={self.host + ':' if self.host else ''}{self.path}"


def parse_drafter(text: str, inventory: Inventory) -> DrafterRef:
    """``NAME=[HOST:]PATH``; HOST must be an inventory host, PATH absolute."""
    name, sep, where = text.partition("=")
    if not sep or not name or not where:
        raise InputError(f"--drafter {text!r}: expected NAME=[HOST:]PATH, e.g. ours=kpro6:/ckpt/step_20000.pt")
    if not NAME_RE.match(name):
        raise InputError(f"--drafter {text!r}: name {name!r} must be letters, digits, '.', '_' or '-'")
    named, colon, path = where.partition(":")
    host: str | None = named
    if not colon or where.startswith("/"):
        host, path = None, where
    elif host not in inventory.hosts:
        raise InputError(f"--drafter {text!r}: unknown host {host!r}",
                         hint=f"known hosts: {', '.join(inventory.hosts)}")
    if not path.startswith("/"):
        raise InputError(f"--drafter {text!r}: {path!r} is not an absolute path on "
                         f"{host or 'the eval host'}")
    return DrafterRef(name, host, posixpath.normpath(path))


@dataclass
class EvalRequest:
    hosts: list[str]
    target: str
    drafters: list[DrafterRef]
    prompts: str = "builtin"            # "builtin" or a local JSONL file (uploaded with the job)
    reference: str = "target"           # "target" (greedy on the eval host), "server" (the host's serve_url)
                                        # or an OpenAI-compatible URL (as seen from the eval host)
    device: str = "auto"
    dtype: str = "bfloat16"
    enable_thinking: bool = False
    max_new_tokens: int = 256
    samples: int | None = None
    diagnose: bool = False
    online_check: bool = False
    strip_optimizer: bool | None = None  # None: strip training checkpoints (*.pt, …) relayed from elsewhere
    force: bool = False                  # ignore the eval host's job lock
    seed: int = 0
    threads: int | None = None           # torch CPU threads on the eval host (None: torch's default)
    tree_k: int | None = None            # DDTree-k (payload default 8)
    tree_budget: int | None = None       # budgeted DDTree nodes (payload default 16)
    diagnose_samples: int | None = None
    expect_p1: list[str] = field(default_factory=list)   # "P" or "NAME=P": position-1 acceptance expected
    reference_model: str | None = None
    allow_insecure_reference: bool = False  # http:// to a non-loopback endpoint (the API key in clear text)
    payload_args: list[str] = field(default_factory=list)  # passed verbatim to `remote_payload eval`
    engine: str | None = None            # "vllm": every drafter also served by vLLM after the offline eval

    @property
    def uses_engine(self) -> bool:
        """A vLLM server runs on the eval host (--engine vllm or --reference vllm)."""
        return self.engine is not None or self.reference in ENGINES


@dataclass
class RelayStep:
    drafter: str
    source: str          # HOST:PATH
    destination: str     # HOST:DIR/ (trailing slash: the relay names the file inside)
    strip: bool
    lands_at: str        # the drafter's path on the eval host after the relay

    @property
    def dest_host(self) -> str:
        return self.destination.split(":", 1)[0]


@dataclass
class HostJob:
    host: str
    shard: tuple[int, int]
    drafters: dict[str, str]             # name -> path on this host
    args: list[str]                      # payload arguments after `python -m remote_payload`
    prompts_upload: str | None = None    # remote path the local prompts file is uploaded to


@dataclass
class EvalPlan:
    request: EvalRequest
    deploy_hosts: list[str]
    provision_hosts: list[str]
    relays: list[RelayStep] = field(default_factory=list)
    jobs: list[HostJob] = field(default_factory=list)
    checks: dict[str, list[str]] = field(default_factory=dict)  # host -> paths that must exist there
    engine_pythons: dict[str, str] = field(default_factory=dict)  # host -> the engine venv's python (--engine)

    def as_dict(self) -> dict:
        return asdict(self)


def relay_dir(inventory: Inventory, host: str, source_host: str) -> str:
    h = inventory.hosts[host]
    base = h.paths.checkpoints or posixpath.join(h.workdir, "checkpoints")
    return posixpath.join(base, RELAY_SUBDIR, source_host)


def validate_request(req: EvalRequest, inventory: Inventory) -> None:
    if not req.hosts:
        raise InputError("give at least one --host (the eval host), e.g. --host ct129")
    inventory.select(req.hosts)
    if not req.target.startswith("/"):
        raise InputError(f"--target {req.target!r}: expected an absolute path on the eval host")
    if not req.drafters:
        raise InputError("give at least one --drafter NAME=[HOST:]PATH")
    names = [d.name for d in req.drafters]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InputError(f"drafter name(s) used twice: {', '.join(dupes)}")
    if req.max_new_tokens < 1:
        raise InputError("--max-new-tokens must be at least 1")
    if req.samples is not None and req.samples < 1:
        raise InputError("--samples must be at least 1")
    if req.samples is not None and req.samples < len(req.hosts):
        raise InputError(f"--samples {req.samples} is fewer than the {len(req.hosts)} hosts it is sharded over")
    if req.device not in ("auto", "cuda", "cpu"):
        raise InputError(f"--device {req.device!r}: expected auto, cuda or cpu")
    if req.reference not in ("target", "server", *ENGINES) and not re.match(r"^https?://", req.reference):
        raise InputError(f"--reference {req.reference!r}: expected 'target', 'server', 'vllm' or an http(s):// URL")
    if req.engine is not None and req.engine not in ENGINES:
        raise InputError(f"--engine {req.engine!r}: expected one of {', '.join(ENGINES)}")
    if req.reference == "server":
        missing = [h for h in req.hosts if not inventory.hosts[h].serve_url]
        if missing:
            raise InputError(f"--reference server: no serve_url in the inventory for {', '.join(missing)}",
                             hint="set it (dfo inventory set HOST.serve_url http://127.0.0.1:30000/v1) or give the URL")
    urls = [inventory.hosts[h].serve_url or "" for h in req.hosts] if req.reference == "server" else \
        [] if req.reference in ENGINES else [req.reference]
    for url in urls:
        if not req.allow_insecure_reference and insecure_url(url):
            raise InputError(f"--reference {url!r}: plain http to a host that is not the eval host itself; the "
                             "API key ($DFO_REFERENCE_API_KEY) and every prompt would cross the network in clear "
                             "text",
                             hint="use https://, a loopback address (an SSH tunnel), "
                             "or pass --allow-insecure-reference")


def insecure_url(url: str) -> bool:
    """http:// to anything but loopback (as seen from the eval host, where the request is made)."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        return False
    host = (parts.hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def plan_eval(req: EvalRequest, inventory: Inventory, *, prompts_digest: str | None = None,
              payload_args_extra: list[str] | None = None) -> EvalPlan:
    """``prompts_digest``: sha256 of the local prompts file (it is uploaded under a content name)."""
    validate_request(req, inventory)
    if req.prompts != "builtin" and not prompts_digest:
        raise InputError("a prompts file needs its digest to be planned")
    hosts = list(dict.fromkeys(req.hosts))
    relays, checks, per_host_paths = _place_drafters(req, inventory, hosts)
    engine_pythons = {h: engine_python(inventory, h) for h in hosts} if req.uses_engine else {}
    for h, python in engine_pythons.items():
        checks[h].append(python)  # a clear error before anything changes when the venv is not provisioned
    jobs = []
    for i, h in enumerate(hosts):
        prompts_remote = None
        if req.prompts != "builtin":
            prompts_remote = posixpath.join(inventory.hosts[h].workdir, "inputs",
                                            f"prompts-{(prompts_digest or '')[:16]}.jsonl")
        args = _payload_args(req, inventory, h, per_host_paths[h], prompts_remote or req.prompts, (i, len(hosts)))
        args += _engine_args(req, engine_pythons.get(h))
        args += list(req.payload_args) + list(payload_args_extra or [])
        jobs.append(HostJob(h, (i, len(hosts)), per_host_paths[h], args, prompts_remote))
    # A relay with stripping deploys the payload to its source host itself.
    return EvalPlan(req, deploy_hosts=hosts, provision_hosts=hosts, relays=relays, jobs=jobs, checks=checks,
                    engine_pythons=engine_pythons)


def engine_python(inventory: Inventory, host: str) -> str:
    """The engine venv's interpreter on ``host`` (``dfo provision --host HOST --engine vllm`` builds it)."""
    return posixpath.join(inventory.hosts[host].engine_venv, "bin", "python")


def _engine_args(req: EvalRequest, python: str | None) -> list[str]:
    if python is None:
        return []
    args = ["--engine", req.engine] if req.engine else []
    if req.reference in ENGINES:
        args += ["--reference", req.reference]
    return args + ["--engine-python", python]


def _place_drafters(req: EvalRequest, inventory: Inventory, hosts: list[str]):
    """Where each drafter is read on each eval host, the relays that put it there, the paths to check."""
    relays: list[RelayStep] = []
    checks: dict[str, list[str]] = {h: [req.target] for h in hosts}
    per_host_paths: dict[str, dict[str, str]] = {h: {} for h in hosts}
    for d in req.drafters:
        if d.host is None:
            for h in hosts:
                checks[h].append(d.path)
                per_host_paths[h][d.name] = d.path
            continue
        checks.setdefault(d.host, []).append(d.path)
        strip = d.is_training_checkpoint if req.strip_optimizer is None else req.strip_optimizer
        for h in hosts:
            if d.host == h:
                per_host_paths[h][d.name] = d.path  # already where it is needed
                continue
            dest_dir = relay_dir(inventory, h, d.host)
            name = posixpath.basename(d.path)
            lands = posixpath.join(dest_dir, strip_dir_name(name) if strip else name)
            relays.append(RelayStep(d.name, f"{d.host}:{d.path}", f"{h}:{dest_dir}/", strip, lands))
            per_host_paths[h][d.name] = lands
    return relays, checks, per_host_paths


def _payload_args(req: EvalRequest, inventory: Inventory, host: str, drafters: dict[str, str], prompts: str,
                  shard: tuple[int, int]) -> list[str]:
    """`python -m remote_payload eval …` for one host."""
    args = ["eval", "--target", req.target]
    for name, path in drafters.items():
        args += ["--drafter", f"{name}={path}"]
    args += ["--prompts", prompts, "--max-new-tokens", str(req.max_new_tokens),
             "--device", req.device, "--dtype", req.dtype,
             "--enable-thinking" if req.enable_thinking else "--no-enable-thinking",
             "--seed", str(req.seed), "--out", "{results}"]
    if req.samples is not None:
        args += ["--samples", str(req.samples)]
    if shard[1] > 1:
        args += ["--shard", f"{shard[0]}/{shard[1]}"]
    if req.reference == "server":
        args += ["--reference", inventory.hosts[host].serve_url or ""]  # validate_request made sure it is set
    elif req.reference not in ("target", *ENGINES):  # an engine reference: _engine_args
        args += ["--reference", req.reference]
    if req.threads:
        args += ["--threads", str(req.threads)]
    if req.diagnose:
        args += ["--diagnose"]
    if req.diagnose_samples is not None:
        args += ["--diagnose-samples", str(req.diagnose_samples)]
    for expect in req.expect_p1:
        args += ["--expect-p1", expect]
    if req.tree_k is not None:
        args += ["--tree-k", str(req.tree_k)]
    if req.tree_budget is not None:
        args += ["--tree-budget", str(req.tree_budget)]
    if req.reference_model and req.reference not in ("target", *ENGINES):
        args += ["--reference-model", req.reference_model]
    if req.online_check:
        args += ["--online-check"]
    return args
