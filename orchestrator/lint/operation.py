"""`dfo lint`: a drafter's configs and safetensors headers (and its target's) read where the files are, then
the rules (rules.py) turn them into findings. Also the check `dfo eval` and `dfo watch` run on every drafter before
anything is relayed or started (``lint_before_eval``).

A path is local or ``HOST:PATH`` (an inventory host). On a host the facts come from host_script.py through
hostcall (nothing installed, read-only); a local path runs the same functions in this process."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from orchestrator.core.errors import InputError
from orchestrator.core.events import Events
from orchestrator.lint import replies
from orchestrator.lint.rules import ERROR, INFO, WARNING, Finding, finding, lint

HOST_SCRIPT = Path(__file__).with_name("host_script.py")
FACTS_TIMEOUT = 600  # --deep hashes a real target's embedding and lm_head (GBs); without it, seconds
SKIPPED = "lint skipped (--no-lint): the drafters' configs and headers were not checked before the eval"


@dataclass(frozen=True)
class Place:
    host: str | None  # None: this machine
    path: str

    def label(self) -> str:
        return f"{self.host}:{self.path}" if self.host else self.path


def parse_place(text: str, known_hosts: Callable[[], Any], what: str) -> Place:
    """``HOST:PATH`` with HOST in the inventory, else a local path (KNOWN_HOSTS loads the inventory only when the
    text names a host)."""
    host, colon, path = text.partition(":")
    if not colon or text.startswith(("/", ".", "~")) or "/" in host:
        local = Path(text).expanduser()
        if not local.exists():
            raise InputError(f"{what} {text}: no such file or folder here",
                             hint="a path on another machine is HOST:PATH, HOST an inventory host")
        return Place(None, str(local.resolve()))
    hosts = known_hosts()
    if host not in hosts:
        raise InputError(f"{what} {text!r}: unknown host {host!r}", hint=f"known hosts: {', '.join(hosts)}")
    if not path.startswith("/"):
        raise InputError(f"{what} {text!r}: {path!r} is not an absolute path on {host}")
    return Place(host, posixpath.normpath(path))


@dataclass
class LintReport:
    drafter: str
    target: str | None
    findings: list[Finding] = field(default_factory=list)
    name: str | None = None  # the drafter's name in an eval

    def by(self, severity: str) -> list[Finding]:
        return [f for f in self.findings if f.severity == severity]

    @property
    def ok(self) -> bool:
        return not self.by(ERROR)

    def to_json(self) -> dict:
        return {"drafter": self.drafter, "target": self.target, "name": self.name, "ok": self.ok,
                "errors": len(self.by(ERROR)), "warnings": len(self.by(WARNING)), "infos": len(self.by(INFO)),
                "findings": [f.to_json() for f in self.findings]}


_LOCAL: dict[str, Any] = {}


def local_call(func: str, **kwargs) -> Any:
    """FUNC of the host script, run here (the same program hostcall sends: the prelude, then the script)."""
    if not _LOCAL:
        from orchestrator.transport.hostcall import program_source

        exec(compile(program_source(HOST_SCRIPT), str(HOST_SCRIPT), "exec"), _LOCAL)  # noqa: S102 - our own file
    return _LOCAL[func](**kwargs)


def _facts(connector, place: Place, func: str, **kwargs) -> tuple[str, Any]:
    if place.host is None:
        return "this machine", local_call(func, path=place.path, **kwargs)
    from orchestrator.transport import hostcall

    python = connector.inventory.hosts[place.host].python
    return place.host, hostcall.call(connector.session(place.host), HOST_SCRIPT, func, python=python,
                                     timeout=FACTS_TIMEOUT, path=place.path, **kwargs)


def probe_ids(d: replies.DrafterFacts) -> list[int]:
    """The token ids whose pieces the target's tokenizer is asked for: the mask id, wherever the config keeps it."""
    cfg = d.doc("config.json") if d.kind != "torch" else next((doc.data for doc in d.json.values()), None)
    cfg = cfg if isinstance(cfg, dict) else {}
    dcfg = cfg["dflash_config"] if isinstance(cfg.get("dflash_config"), dict) else {}
    ids = [dcfg.get("mask_token_id"), cfg.get("mask_token_id")]
    return sorted({i for i in ids if isinstance(i, int) and not isinstance(i, bool) and i >= 0})


def lint_checkpoint(connector, drafter: Place, target: Place | None = None, *, deep: bool = False,
                    enable_thinking: bool | None = None, engine_ks: tuple[int, ...] = (),
                    name: str | None = None) -> LintReport:
    """Lint DRAFTER (against TARGET): one read of each side where its files are, then the rules."""
    host, raw = _facts(connector, drafter, "drafter_facts", deep=deep)
    d = replies.drafter_facts(host, drafter.label(), raw)
    report = LintReport(drafter.label(), target.label() if target else None, name=name)
    if d is None:
        report.findings.append(finding("not-found", "DRAFTER", f"{drafter.label()}: no such file or folder"))
        return report
    t = None
    if target is not None:
        thost, traw = _facts(connector, target, "target_facts", probe_ids=probe_ids(d), deep=deep)
        t = replies.target_facts(thost, target.label(), traw)
        if t is None:
            report.findings.append(finding("not-found", "--target", f"{target.label()}: no such folder"))
    report.findings.extend(lint(d, t, enable_thinking=enable_thinking, engine_ks=engine_ks))
    return report


def finding_line(f: Finding) -> str:
    return f"{f.severity.upper()} [{f.code}] {f.field}: {f.message} — {f.action}"


def lint_before_eval(connector, plan, events: Events) -> list[LintReport]:
    """Every drafter of an eval PLAN, linted where its files are against the eval host's target, before anything
    is relayed or started: warnings are shown, errors stop it (InputError, exit 2). --no-lint skips it."""
    from remote_payload.eval.options import parse_engine_k

    request = plan.request
    if not request.lint:
        events.warn(SKIPPED)
        return []
    events.step("lint the drafters (configs and safetensors headers)")
    target = Place(request.hosts[0], request.target)
    ks = parse_engine_k(request.engine_k) if request.engine_k else ()
    reports, failed = [], []
    for d in request.drafters:
        report = lint_checkpoint(connector, Place(d.host or request.hosts[0], d.path), target,
                                 enable_thinking=request.enable_thinking, engine_ks=ks, name=d.name)
        reports.append(report)
        for f in report.by(WARNING):
            events.warn(f"drafter '{d.name}': {finding_line(f)}")
        if not report.ok:
            failed.append(report)
    if failed:
        lines = [f"  drafter '{r.name}' ({r.drafter}): {finding_line(f)}" for r in failed for f in r.by(ERROR)]
        raise InputError("dfo lint found errors; nothing was relayed or started:\n" + "\n".join(lines),
                         hint="fix them (docs/lint.md says what each code means), or run again with --no-lint")
    return reports
