"""`dfo watch --proxy-logdir DIR`: after each checkpoint's τ, the trainer's own proxy at that step beside it,
and the divergence check (divergence.py) that raises an alert when the two part.

Per checkpoint the watcher reads the proxies' logs once on the training host (proxies.fetch), records the
proxy's value at each evaluated checkpoint's step in its series entry (``proxy``: name, value as logged,
the step it was logged at, the kind of log and where), checks the series so far and records the outcome on
the entry (``proxy_check``) and, when the checkpoint completes a run of disagreeing ones, the alert
(``proxy_alert``). After an alert the next checkpoint is evaluated once with --diagnose (one-off eval job:
the resident worker does not serve it); the alert entry's ``diagnosed_in`` names that checkpoint.

Nothing here stops the watcher: a log that cannot be read is a warning and the checkpoint keeps its τ.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Callable

from orchestrator.core.errors import DfoError, InputError
from orchestrator.core.events import Events
from orchestrator.transport import Connector
from orchestrator.watch.divergence import Alert, check, points_from_entries
from orchestrator.watch.proxies import DEFAULT_PROXIES, SOURCES, at_checkpoints, check_proxy_names, choose, fetch
from orchestrator.watch.series import done_entries


@dataclass(frozen=True)
class ProxyOptions:
    logdir: str                                  # the trainer's logdir on the training host
    proxies: tuple[str, ...] = DEFAULT_PROXIES   # tags in order of preference; '-TAG': lower is better


def proxy_options(logdir: str | None, proxies: list[str], folder: str) -> ProxyOptions | None:
    """--proxy-logdir and --proxy: None when neither is given; --proxy alone reads the checkpoint folder
    (where Hugging Face Trainer keeps trainer_state.json)."""
    if logdir is None and not proxies:
        return None
    if logdir is not None and not logdir.startswith("/"):
        raise InputError(f"--proxy-logdir {logdir!r}: expected an absolute path on the training host",
                         hint="the trainer's logdir (TensorBoard event files, trainer_state.json, *.jsonl)")
    names = tuple(check_proxy_names(proxies, "--proxy")) if proxies else DEFAULT_PROXIES
    return ProxyOptions(posixpath.normpath(logdir or folder), names)


def oriented(proxy: dict) -> float:
    """The recorded value as the statistics see it: higher is better (a '-' proxy negated)."""
    return -float(proxy["value"]) if str(proxy["name"]).startswith("-") else float(proxy["value"])


def alert_record(alert: Alert, name: str) -> dict:
    return {"kind": alert.kind, "since": alert.since, "text": alert.text(name),
            "proxy_change": round(alert.proxy_change, 6), "tau_change": round(alert.tau_change, 6),
            "tau_change_ci": [round(c, 6) for c in alert.tau_change_ci]}


class ProxyWatch:
    def __init__(self, connector: Connector, host: str, options: ProxyOptions, events: Events,
                 publish: Callable[[dict], None]):
        """``publish(entry)`` records a changed entry (the watcher's journal)."""
        self.connector, self.host, self.options, self.events = connector, host, options, events
        self.publish = publish
        self._said_none = False

    @property
    def where(self) -> str:
        return f"{self.host}:{self.options.logdir}"

    def after(self, series: dict, e: dict) -> Alert | None:
        """E's τ is recorded: read the proxies, give every evaluated checkpoint without a proxy value its value
        (E included; the others are published), check the series; returns the alert E completes, if any. Never
        raises: whatever goes wrong here (a hostile log, a bug) is a warning and the checkpoint keeps its τ."""
        try:
            return self._after(series, e)
        except DfoError as exc:
            self.events.warn(f"the trainer's proxies in {self.where} were not read: {exc.message} "
                             "(tried again after the next checkpoint)")
        except Exception as exc:  # noqa: BLE001 - the proxy is advice: it never stops the watcher
            self.events.warn(f"the proxy check after {e.get('name')} failed ({type(exc).__name__}: "
                             f"{str(exc)[:200]}); τ is recorded without it (tried again after the next checkpoint)")
        return None

    def _after(self, series: dict, e: dict) -> Alert | None:
        path = str(e.get("path") or "")
        prefer = tuple(p for p in (path, posixpath.dirname(path)) if p.startswith("/"))  # the checkpoint's folder
        logged, sources, origins = fetch(self.connector, self.host, self.options.logdir, self.options.proxies,
                                         prefer)
        done = done_entries(series)
        name = self._chosen(done, logged)
        if name is None:
            if not self._said_none:
                self._said_none = True
                self.events.warn(f"none of the proxies {', '.join(self.options.proxies)} is logged in {self.where} "
                                 "(yet); τ is recorded without one")
            return None
        matched = at_checkpoints(logged[name], [x["step"] for x in done])
        for x in done:
            if x["step"] in matched and (x.get("proxy") or {}).get("name") != name:
                logged_step, value = matched[x["step"]]
                x["proxy"] = {"name": name, "value": -value if name.startswith("-") else value,
                              "logged_step": logged_step, "source": sources.get(name, "log"), "logdir": self.where,
                              "file": origins.get(name, {}).get(logged_step)}
                if x is not e:
                    self.publish(x)
        at = {x["step"]: (x["proxy"]["logged_step"], oriented(x["proxy"]))
              for x in done if (x.get("proxy") or {}).get("name") == name}
        checks, alerts = check(points_from_entries(done, at))
        mine = next((c for c in checks if c.step == e["step"]), None)
        if mine is not None and mine.predicted is not None:
            e["proxy_check"] = {"predicted": round(mine.predicted, 4), "z": round(mine.z or 0.0, 3),
                                "disagrees": mine.disagrees}
        alert = next((a for a in alerts if a.step == e["step"]), None)
        if alert is not None:
            e["proxy_alert"] = alert_record(alert, name)
        return alert

    def _chosen(self, done: list[dict], logged: dict) -> str | None:
        """The proxy the series already follows (while the run still logs it), else the first one logged."""
        earlier = [x["proxy"]["name"] for x in done if isinstance(x.get("proxy"), dict)]
        if earlier and logged.get(earlier[-1]):
            return earlier[-1]
        return choose(logged, self.options.proxies)


def take_diagnosis(series: dict, name: str, publish: Callable[[dict], None]) -> dict | None:
    """The alert entry whose diagnosis checkpoint NAME is: the earliest alert not yet diagnosed is given to
    NAME (and published), and an alert already given to NAME stays its (a retried attempt diagnoses again)."""
    for x in done_entries(series):
        alert = x.get("proxy_alert")
        if not isinstance(alert, dict):
            continue
        if alert.get("diagnosed_in") == name:
            return x
        if alert.get("diagnosed_in") is None and x["name"] != name:
            alert["diagnosed_in"] = name
            publish(x)
            return x
    return None


def source_text(proxy: dict) -> str:
    """'train/acc_0 from TensorBoard events in kpro6:/data/run7/tb (higher is better)'."""
    name = str(proxy.get("name"))
    better = "lower" if name.startswith("-") else "higher"
    tag = name[1:] if name.startswith("-") else name
    return (f"{tag} from {SOURCES.get(str(proxy.get('source')), 'the trainer log')} in {proxy.get('logdir')} "
            f"({better} is better)")
