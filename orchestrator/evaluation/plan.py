"""What `dfo eval` will do, decided from the request and the inventory alone (pure: no I/O).

The plan is what `--dry-run` prints and what `operation.py` executes: which hosts get the payload and a
venv, which drafters are relayed (and stripped of optimizer state) to which eval host, and the exact
payload command each eval host runs on its shard of the prompts.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import posixpath
import re
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import Inventory
from orchestrator.evaluation.datasets import plan_datasets
from orchestrator.relay.plan import strip_dir_name
from remote_payload.cli import build_parser
from remote_payload.errors import PayloadError
from remote_payload.eval import options as declared
from remote_payload.eval.options import ENGINES  # serving engines the payload can start on the eval host
from remote_payload.eval.settings import check_values, settings_from_values

TRAINING_CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")
OPTIONS_HINT = "dfo's options: `dfo eval --help`; the payload's: `python -m remote_payload eval --help`"
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
    """One eval as dfo runs it. Besides the hosts and drafters, every field is an option declared in
    remote_payload/eval/options.py (with its default there; tests/evaluation/test_eval_options.py checks)."""

    hosts: list[str]
    target: str
    drafters: list[DrafterRef]
    prompts: str = "builtin"            # "builtin" or a local JSONL file (uploaded with the job)
    datasets: list[str] = field(default_factory=list)  # NAME[:split][@N]: benchmark datasets instead of prompts
    suite: str | None = None            # "zlab": z-lab's sets and counts
    dataset_files: list[str] = field(default_factory=list)  # NAME=PATH on the eval host (exported rows)
    reference: str = "target"           # "target" (greedy on the eval host), "server" (the host's serve_url)
                                        # or an OpenAI-compatible URL (as seen from the eval host)
    device: str = "auto"
    dtype: str = "bfloat16"
    enable_thinking: bool | str = False  # or "both": every prompt under each mode
    max_new_tokens: int = 256
    temperature: float | None = None     # > 0: continuations sampled at T (payload default 0: greedy)
    top_p: float | None = None
    top_k: int | None = None
    samples_per_prompt: int | None = None  # draws per prompt at T > 0 (payload default 1)
    protocol: str | None = None          # a named card protocol (remote_payload/eval/protocols.py)
    card: str | None = None              # a published card: a shipped name or a local file (remote_payload/cards/)
    explain: bool = False                # with a card: rank the knobs behind a gap
    explain_prompts: int | None = None   # rows of --explain's subset reruns (payload default 16)
    draft_rule: str | None = None        # at T > 0: "sampled" or "greedy" (payload default sampled)
    selection: str | None = None         # dataset rows: zlab-transformers (payload default) or zlab-server
    selection_concurrency: int | None = None  # zlab-server: warm-up rows (payload default 1)
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
    payload_args: list[str] = field(default_factory=list)  # options of `remote_payload eval` dfo has none of
    engine: str | None = None            # "vllm": every drafter also served by vLLM after the offline eval
    engine_concurrency: str | None = None  # "1,4,16": requests in flight per level of the engine sweep
    cache_limit_gib: float | None = None  # the host's reference/feature cache size limit (payload default 200)
    engine_k: str | None = None  # "1,3": extra draft counts timed per drafter in the engine
    engine_check: str | None = None  # "synthetic": the engine replays each drafter's profile (its marginals)
    decode_batch: str | None = None  # rows per forward in the reference stage: N or auto (payload default auto)
    lint: bool = True  # `dfo lint` on every drafter before anything is relayed or started (--no-lint: skipped)

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
    uploads: list[tuple[str, str]] = field(default_factory=list)  # (local file, remote path): dataset rows


@dataclass
class EvalPlan:
    request: EvalRequest
    deploy_hosts: list[str]
    provision_hosts: list[str]
    relays: list[RelayStep] = field(default_factory=list)
    jobs: list[HostJob] = field(default_factory=list)
    checks: dict[str, list[str]] = field(default_factory=dict)  # host -> paths that must exist there
    engine_pythons: dict[str, str] = field(default_factory=dict)  # host -> the engine venv's python (--engine)
    prompt_count: int | None = None  # prompts (or dataset rows) before sharding, where known
    card: list[str] = field(default_factory=list)  # --card: what the job measures against it and --explain's cost

    def as_dict(self) -> dict:
        return asdict(self)


def relay_dir(inventory: Inventory, host: str, source_host: str) -> str:
    h = inventory.hosts[host]
    base = h.paths.checkpoints or posixpath.join(h.workdir, "checkpoints")
    return posixpath.join(base, RELAY_SUBDIR, source_host)


def hosts_used(req: EvalRequest) -> list[str]:
    """Every host the eval runs or relays from: their ``env`` (with its ``${VAR}`` references) is used."""
    return list(dict.fromkeys([*req.hosts, *(d.host for d in req.drafters if d.host)]))


def eval_hosts(given: list[str], inventory: Inventory) -> list[str]:
    """--host as given, else the inventory's hosts with the eval role."""
    if given:
        return inventory.select(given)
    chosen = [name for name, host in inventory.hosts.items() if "eval" in host.roles]
    if not chosen:
        raise InputError(f"no --host given, and no host in {inventory.source} has the eval role",
                         hint="name the eval host with --host HOST, or give it `roles: [eval]` in the inventory")
    return chosen


def validate_request(req: EvalRequest, inventory: Inventory, *, prompt_count: int | None = None) -> None:
    """Everything that can be checked without a host. ``prompt_count``: prompts in the set (it was parsed)."""
    if not req.hosts:
        raise InputError("give at least one --host (the eval host), e.g. --host ct129")
    inventory.select(req.hosts)
    if not req.target.startswith("/"):
        raise InputError(f"--target {req.target!r}: expected an absolute path on the eval host",
                         hint="paths are paths on the eval host, e.g. /data/models/Qwen3.6-27B")
    if not req.drafters:
        raise InputError("give at least one --drafter NAME=[HOST:]PATH")
    names = [d.name for d in req.drafters]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InputError(f"drafter name(s) used twice: {', '.join(dupes)}")
    try:  # after --protocol filled its values: an option that means nothing alone is refused, never ignored
        declared.check_needs(vars(req), declared.request_options(), at_request_default)
    except PayloadError as exc:
        raise InputError(str(exc), hint="add the option it needs, or drop it") from None
    check_payload_args(req.payload_args)
    sizes = [n for n in (req.samples, prompt_count) if n is not None]
    if sizes and min(sizes) < len(req.hosts):
        what = f"--samples {req.samples}" if req.samples == min(sizes) else f"the prompt set's {prompt_count} prompt(s)"
        raise InputError(f"{what} is fewer than the {len(req.hosts)} hosts it is sharded over",
                         hint="give fewer --host or more prompts")
    if not (req.datasets or req.suite) and req.samples and prompt_count and req.samples > prompt_count:
        raise InputError(f"--samples {req.samples}: the prompt set holds {prompt_count} prompt(s), so the eval would "
                         f"run {prompt_count}, not {req.samples}",
                         hint=f"give --samples {prompt_count} or fewer, or more prompts (--prompts FILE, --dataset)")
    if req.reference not in ("target", "server", *ENGINES) and not re.match(r"^https?://", req.reference):
        raise InputError(f"--reference {req.reference!r}: expected 'target', 'server', "
                         + ", ".join(f"'{e}'" for e in ENGINES) + " or an http(s):// URL")
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


def check_declared_values(req: EvalRequest) -> None:
    """Each option's value against its declaration (its choices, a protocol, an engine and its release, its
    bounds, its parser): the checks the payload would make, made here first, before anything is planned. An
    option declared with choices (a new one too: a card) is checked here by being declared."""
    for option in declared.request_options():
        try:
            declared.check_value(option, getattr(req, option.field))
        except PayloadError as exc:
            raise InputError(str(exc), hint=f"see {option.flag} in `dfo eval --help`") from None
    if req.dtype == "float16" and "--allow-fp16" not in req.payload_args:
        raise InputError(declared.FP16_REFUSED, hint="use --dtype bfloat16 (float32 on CPU), or force float16 with "
                         "--payload-arg=--allow-fp16")


def at_request_default(option: declared.Option, value) -> bool:
    """dfo's unset form of an option: what EvalRequest holds when the user gives nothing."""
    return value in (None, [], False) or value == option.request_default


def check_payload_args(args: list[str]) -> None:
    """--payload-arg values: options of `remote_payload eval` that dfo does not set itself."""
    expects_value = False
    for arg in args:
        if expects_value:  # the value of the option before it (--payload-arg=--engine-arg --payload-arg=X)
            expects_value = False
            continue
        flag, eq, _ = arg.partition("=")
        if not flag.startswith("--"):
            raise InputError(f"--payload-arg {arg!r}: expected an option of the payload, --NAME or --NAME=VALUE",
                             hint="e.g. --payload-arg=--reference-timeout=300; " + OPTIONS_HINT)
        option = declared.BY_FLAG.get(flag)
        if option is None or not option.payload:
            close = difflib.get_close_matches(flag[2:], [o.flag[2:] for o in declared.payload_options()], n=1)
            raise InputError(f"--payload-arg {arg!r}: `remote_payload eval` has no option {flag}"
                             + (f" (did you mean --{close[0]}?)" if close else ""), hint=OPTIONS_HINT)
        if option.in_request or option.planned:
            own = f"give it as dfo's own {flag}" if option.commands else "dfo sets it itself"
            raise InputError(f"--payload-arg {arg!r}: {flag} is not for --payload-arg: {own}", hint=OPTIONS_HINT)
        expects_value = option.kind is not bool and not eq


def check_payload_argv(args: list[str]) -> None:
    """The payload's own parser and value checks on the command a host will run (no file is read)."""
    try:
        parsed = build_parser().parse_args(args)
        check_values(settings_from_values(vars(parsed)))
    except PayloadError as exc:
        raise InputError(f"the payload would refuse this eval: {exc}", hint=OPTIONS_HINT) from None


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


def with_protocol(req: EvalRequest) -> EvalRequest:
    """The request with ``--protocol``'s values in every option left at its default (a conflicting option is
    refused by the payload's own check on the planned command, which names it)."""
    if not req.protocol:
        return req
    from remote_payload.eval import protocols

    try:
        return with_fixed(req, protocols.preset(req.protocol))
    except PayloadError as exc:
        raise InputError(str(exc)) from None


def with_fixed(req: EvalRequest, fixed: dict) -> EvalRequest:
    """``fixed``'s value (a protocol's, a card's) in every request option left at its default."""
    from remote_payload.eval import protocols

    fields = {f.name for f in dataclasses.fields(req)}
    defaults = {o.field: o.request_default for o in declared.request_options() if o.field in fields}
    values = {k: getattr(req, k) for k in fixed if k in fields}
    return dataclasses.replace(req, **protocols.fill_from(values, defaults, {k: fixed[k] for k in values}))


def load_request_card(spec: str):
    """``--card NAME|FILE`` on the controller: a shipped card or a local file, its schema checked before anything
    connects (the file and the field named)."""
    from remote_payload.cards.schema import load_card

    try:
        return load_card(spec)
    except PayloadError as exc:
        raise InputError(str(exc), hint="docs/cards.md describes every card field; shipped cards: "
                         "remote_payload/cards/data/") from None


def with_card(req: EvalRequest) -> EvalRequest:
    """The request with ``--card``'s known protocol values in every option left at its default, as
    ``with_protocol`` (a conflicting option is refused by the payload's check on the planned command)."""
    if not req.card:
        return req
    from remote_payload.cards import protocol as card_protocol

    card = load_request_card(req.card)
    if req.explain and len(req.hosts) > 1:
        raise InputError(f"--explain reruns the first rows of one host's share: evaluate card {card.card} on one "
                         "host", hint="give one --host, or drop --explain (the verdict is computed over every host)")
    return with_fixed(req, card_protocol.fixed_values(card))


def card_prompts(card_spec: str | None, prompts: str) -> str:
    """--prompts as the eval reads it: a card's prompts file where --prompts was left at builtin."""
    if not card_spec or prompts != "builtin":
        return prompts
    from remote_payload.cards import protocol as card_protocol
    from remote_payload.cards.schema import is_prompts_file

    card = load_request_card(card_spec)
    return card_protocol.prompts_path(card) if is_prompts_file(card) else prompts


def card_argument(req: EvalRequest, prompts: str) -> str | None:
    """The payload's ``--card`` value: a shipped card by name, else the card's own document (one JSON line, so
    nothing is uploaded), its prompts file replaced by where the job reads it."""
    if not req.card:
        return None
    from remote_payload.cards.schema import is_prompts_file, parse_card, shipped_names

    if req.card in shipped_names():
        return req.card
    card = load_request_card(req.card)
    doc = card.as_json()
    if is_prompts_file(card) and card.protocol.dataset != "builtin":
        doc["protocol"]["dataset"] = prompts
    return parse_card(doc, card.where).text()


def plan_eval(req: EvalRequest, inventory: Inventory, *, prompts_digest: str | None = None,
              payload_args_extra: list[str] | None = None, prompt_count: int | None = None) -> EvalPlan:
    """``prompts_digest``: sha256 of the local prompts file (it is uploaded under a content name);
    ``prompt_count``: the prompts it holds (the set was parsed)."""
    check_declared_values(req)  # first: a mistyped --protocol or --engine is refused before it is used
    req = with_card(with_protocol(req))
    datasets = plan_datasets(req.datasets, req.suite, req.dataset_files)
    if datasets:  # they replace the prompt set: shards split their rows
        units = [d.units for d in datasets]
        prompt_count = None if None in units else sum(u or 0 for u in units)
    validate_request(req, inventory, prompt_count=prompt_count)
    if req.prompts != "builtin" and not prompts_digest:
        raise InputError("a prompts file needs its digest to be planned")
    hosts = list(dict.fromkeys(req.hosts))
    relays, checks, per_host_paths = _place_drafters(req, inventory, hosts)
    for d in datasets:
        for h in hosts:
            if d.host_path is not None:
                checks[h].append(d.host_path)
    engine = req.engine or (req.reference if req.reference in ENGINES else None)
    engine_pythons = {h: engine_python(inventory, h, engine) for h in hosts} if engine else {}
    for h, python in engine_pythons.items():
        checks[h].append(python)  # a clear error before anything changes when the venv is not provisioned
    jobs = []
    for i, h in enumerate(hosts):
        prompts_remote = None
        if req.prompts != "builtin":
            prompts_remote = posixpath.join(inventory.hosts[h].workdir, "inputs",
                                            f"prompts-{(prompts_digest or '')[:16]}.jsonl")
        planned = _planned_values(req, inventory, h, per_host_paths[h], prompts_remote or req.prompts,
                                  (i, len(hosts)), engine_pythons.get(h))
        workdir = inventory.hosts[h].workdir
        planned["dataset_files"] = [f"{d.name}={d.remote(workdir)}" for d in datasets if not d.bundled]
        args = payload_args(req, planned) + list(payload_args_extra or [])
        check_payload_argv(args)
        uploads = [(str(d.local), d.remote(workdir)) for d in datasets if d.local is not None]
        jobs.append(HostJob(h, (i, len(hosts)), per_host_paths[h], args, prompts_remote, uploads))
    # A relay with stripping deploys the payload to its source host itself.
    counts = [n for n in (req.samples, prompt_count) if n is not None]
    return EvalPlan(req, deploy_hosts=hosts, provision_hosts=hosts, relays=relays, jobs=jobs, checks=checks,
                    engine_pythons=engine_pythons, prompt_count=min(counts) if counts else None,
                    card=card_plan(req))


def card_plan(req: EvalRequest) -> list[str]:
    """The plan's card lines: the verdict, and what --explain adds (it runs by itself on a gap)."""
    if not req.card:
        return []
    from remote_payload.cards.explain import RunSide, explain_cost

    card = load_request_card(req.card)

    def value(name: str):  # the request's value, else the payload's default
        given = getattr(req, name)
        return declared.BY_FIELD[name].default if given is None else given

    # the layer offsets and the drafter's own template are read on the host: both counted as possible here
    run = RunSide(thinking=req.enable_thinking, max_new_tokens=req.max_new_tokens,
                  selection=value("selection") if req.datasets else None, temperature=value("temperature"),
                  top_p=value("top_p"), top_k=value("top_k"), samples_per_prompt=value("samples_per_prompt"),
                  dtype=req.dtype, layer_offsets=(-1, 1), template_unknown=True)
    cost = explain_cost(card, run, value("explain_prompts"), card.protocol.n)
    return [f"card {card.card} ({card.source}): τ {card.figure.tau:g} published; the verdict of drafter "
            f"{req.drafters[0].name} (reproduced, below or above) beside the τ table and in results.json card",
            cost if req.explain else f"{cost} — only if the verdict is not reproduced (--explain: always)"]


def engine_python(inventory: Inventory, host: str, engine: str = "vllm") -> str:
    """The engine venv's interpreter on ``host`` (``dfo provision --host HOST --engine ENGINE`` builds it)."""
    return posixpath.join(inventory.hosts[host].engine_venv_for(engine), "bin", "python")


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


def payload_args(req: EvalRequest, planned: dict) -> list[str]:
    """`python -m remote_payload eval …` for one host: every declared payload option, its value from the
    request or (``planned``, by field) from the planner, then --payload-arg as given."""
    values = {}
    for option in declared.payload_options():
        if option.planned:
            values[option.field] = planned[option.field]  # a KeyError here: a planned option nobody plans
        elif option.in_request:
            values[option.field] = getattr(req, option.field)
    return ["eval", *declared.argv(values), *req.payload_args]


def _planned_values(req: EvalRequest, inventory: Inventory, host: str, drafters: dict[str, str], prompts: str,
                    shard: tuple[int, int], engine_python: str | None) -> dict:
    """The payload values only the planner knows: paths on this host, the shard, the reference source."""
    url = inventory.hosts[host].serve_url if req.reference == "server" else \
        None if req.reference in ("target", *ENGINES) else req.reference  # validate_request: serve_url is set
    engine_reference = req.reference if req.reference in ENGINES else None
    return {"drafters": [f"{name}={path}" for name, path in drafters.items()], "prompts": prompts,
            "out": "{results}", "shard": f"{shard[0]}/{shard[1]}" if shard[1] > 1 else None,
            "reference": engine_reference or url, "reference_model": req.reference_model if url else None,
            "engine": req.engine if engine_python else None, "engine_python": engine_python,
            "card": card_argument(req, prompts)}
