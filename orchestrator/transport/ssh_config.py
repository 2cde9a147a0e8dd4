"""ssh_config, read the way OpenSSH's own client reads it (``ssh -G`` is the reference the tests compare with).

Only what dfo uses is looked up: HostName, Port, User, IdentityFile, UserKnownHostsFile and ProxyJump. The
file's structure is OpenSSH's: ``Host`` and ``Match`` blocks (``all``, ``host``, ``originalhost``, ``user``,
``localuser``, ``exec``, ``canonical``, ``final``, each negatable with ``!``), ``Include`` (globs, relative to
~/.ssh), ``Keyword value`` or ``Keyword=value``, quoted arguments, and the first value obtained for a keyword
wins (IdentityFile accumulates). A ``Match final`` block makes a second pass, as ssh does, in which patterns
see the resolved HostName. What dfo cannot do the same way (``Match localnetwork``/``tagged``, hostname
canonicalisation) is refused with the file and line, never silently read differently from ssh.

Both SSH planes depend on this: the paramiko sessions connect where this says, and the system ssh, given the
same file with ``-F``, must agree (transport/bulk.py pins the values on its command line as well).
"""

from __future__ import annotations

import getpass
import glob
import hashlib
import ipaddress
import os
import re
import socket
import subprocess
from dataclasses import dataclass, field

from orchestrator.core.errors import InputError

_WANTED = {"hostname", "port", "user", "identityfile", "userknownhostsfile", "proxyjump", "canonicalizehostname"}
_MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH
_HINT = "the system ssh reads this file too (ssh -F FILE -G HOST shows what it makes of it)"


@dataclass(frozen=True)
class SshConfigHost:
    """What ssh_config says about one destination (``alias``, the name ssh is given)."""

    alias: str
    # HostName (its %h expanded), else the alias, in the case written: ssh lower-cases it before use, which
    # DNS and its known_hosts matching ignore; paramiko's known_hosts lookup does not, so dfo keeps the case.
    hostname: str
    port: str | None = None
    user: str | None = None
    proxy_jump: str | None = None
    identity_files: tuple[str, ...] = ()  # as written: tokens depend on the final user and port (``expand_path``)
    known_hosts_files: tuple[str, ...] = ()
    source: str | None = None

    def expand_path(self, value: str, *, user: str, port: int) -> str:
        """An IdentityFile/UserKnownHostsFile value as ssh opens it: ``~``, ``%`` tokens and ``${VAR}``."""
        local, host = socket.gethostname(), host_case(self.hostname)
        tokens = {
            "%": "%", "d": os.path.expanduser("~"), "h": host, "k": self.alias, "n": self.alias,
            "p": str(port), "r": user, "u": getpass.getuser(), "i": str(os.getuid()), "l": local,
            "L": local.split(".")[0], "C": hashlib.sha1(f"{local}{host}{port}{user}".encode()).hexdigest(),
        }
        return _percent_expand(_dollar_expand(os.path.expanduser(value), self.source), tokens, self.source)


@dataclass
class _Options:
    """Values in the order ssh obtains them (first one wins)."""

    values: dict[str, str] = field(default_factory=dict)
    identity_files: list[str] = field(default_factory=list)
    known_hosts_files: list[str] = field(default_factory=list)
    where: dict[str, str] = field(default_factory=dict)  # keyword -> "file:line" that set it


@dataclass(frozen=True)
class _Context:
    host: str  # what Host patterns and `Match host` see
    original: str  # the name ssh was given (`Match originalhost`, %n)
    final: bool


def lookup(path: str | None, alias: str) -> SshConfigHost:
    """Resolve ``alias`` through the ssh_config at PATH (None: no file, only defaults)."""
    options = _Options()
    if path is None:
        return SshConfigHost(alias=alias, hostname=alias)
    if not os.path.isfile(path):
        raise InputError(f"ssh_config file not found: {path}", hint="fix 'ssh_config:' in the inventory")
    wants_final = _read(path, _Context(alias, alias, final=False), options, depth=0, active=True)
    if wants_final:
        # ssh's second pass: the blocks are read again with the HostName found so far; values already set stay.
        final_host = host_case(_resolved_hostname(options, alias))
        _read(path, _Context(final_host, alias, final=True), options, depth=0, active=True)
    canonical = options.values.get("canonicalizehostname", "no").lower()
    if canonical in ("yes", "always"):
        raise InputError(f"{options.where['canonicalizehostname']}: CanonicalizeHostname {canonical} applies to "
                         f"{alias!r}; dfo does not canonicalise host names",
                         hint="give the full HostName for this host (or CanonicalizeHostname no)")
    return SshConfigHost(
        alias=alias,
        hostname=_resolved_hostname(options, alias),
        port=options.values.get("port"),
        user=options.values.get("user"),
        proxy_jump=options.values.get("proxyjump"),
        identity_files=tuple(options.identity_files),
        known_hosts_files=tuple(options.known_hosts_files),
        source=path,
    )


def _resolved_hostname(options: _Options, alias: str) -> str:
    raw = options.values.get("hostname")
    if raw is None:
        return alias
    return _percent_expand(raw, {"%": "%", "h": alias}, options.where["hostname"])


def host_case(name: str) -> str:
    """The host name as ssh uses it: lower-cased after HostName is applied, except a numeric address."""
    try:
        ipaddress.ip_address(name.strip("[]"))
        return name
    except ValueError:
        return name.lower()


# ----------------------------------------------------------------------------------- reading


def _read(path: str, ctx: _Context, options: _Options, *, depth: int, active: bool, never_match: bool = False
          ) -> bool:
    """Apply one file's lines to OPTIONS; True when a ``Match final`` asks for a second pass."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise InputError(f"cannot read ssh_config {path}: {exc.strerror or exc}") from None
    wants_final = False
    for number, line in enumerate(lines, 1):
        where = f"{path}:{number}"
        parsed = _split_line(line, where)
        if parsed is None:
            continue
        keyword, args = parsed
        if keyword == "host":
            active = not never_match and _host_line_matches(args, ctx.host, where)
        elif keyword == "match":
            matched, final = _match_line(args, ctx, options, where, evaluate=not never_match)
            active, wants_final = matched and not never_match, wants_final or final
        elif keyword == "include":
            for included in _include_paths(args, where):
                if depth + 1 > _MAX_INCLUDE_DEPTH:
                    raise InputError(f"{where}: Include nested too deeply (over {_MAX_INCLUDE_DEPTH} files)")
                # An included file's own Host/Match lines do not change the including file's state.
                wants_final |= _read(included, ctx, options, depth=depth + 1, active=active,
                                     never_match=never_match or not active)
        elif active and keyword in _WANTED:
            _apply(keyword, args, options, where)
    return wants_final


def _split_line(line: str, where: str) -> tuple[str, list[str]] | None:
    """(lower-case keyword, arguments) of one line, None for a blank or comment line."""
    m = re.match(r"[ \t]*([^ \t\"=]+)(?:[ \t]*=[ \t]*|[ \t]+|$)(.*)", line.rstrip(" \t\f\r\n"))
    if m is None or m.group(1).startswith("#"):
        if line.strip() and not line.strip().startswith("#"):
            raise InputError(f"{where}: cannot read this line: {line.strip()[:80]!r}", hint=_HINT)
        return None
    keyword, rest = m.group(1).lower(), m.group(2)
    args = _split_args(rest, where)
    if not args:
        raise InputError(f"{where}: no argument after keyword {m.group(1)!r}", hint=_HINT)
    return keyword, args


def _split_args(text: str, where: str) -> list[str]:
    """OpenSSH's argv_split: whitespace separates, '…' and "…" group, a backslash escapes a quote, a backslash
    or (unquoted) a space, and '#' at the start of an argument begins a comment."""
    args: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] in " \t":
            i += 1
            continue
        if text[i] == "#":
            break
        arg, quote = [], ""
        while i < n:
            c = text[i]
            if c == "\\" and i + 1 < n and (text[i + 1] in "'\"\\" or (not quote and text[i + 1] == " ")):
                arg.append(text[i + 1])
                i += 2
                continue
            if not quote and c in " \t":
                break
            if not quote and c in "'\"":
                quote = c
            elif quote and c == quote:
                quote = ""
            else:
                arg.append(c)
            i += 1
        if quote:
            raise InputError(f"{where}: unterminated quote", hint=_HINT)
        args.append("".join(arg))
    return args


def _apply(keyword: str, args: list[str], options: _Options, where: str) -> None:
    if keyword == "identityfile":
        _one_arg(keyword, args, where)
        if args[0] not in options.identity_files:  # ssh ignores a repeated key
            options.identity_files.append(args[0])
        return
    if keyword == "userknownhostsfile":
        if not options.known_hosts_files:
            options.known_hosts_files.extend(args)
        return
    _one_arg(keyword, args, where)
    if keyword not in options.values:
        options.values[keyword] = args[0]
        options.where[keyword] = where


def _one_arg(keyword: str, args: list[str], where: str) -> None:
    if len(args) != 1 or args[0] == "":
        raise InputError(f"{where}: {keyword} takes one argument, got {len(args)}", hint=_HINT)


def _include_paths(args: list[str], where: str) -> list[str]:
    paths = []
    for arg in args:
        if not arg:
            raise InputError(f"{where}: empty Include argument", hint=_HINT)
        pattern = arg if arg.startswith(("/", "~")) else os.path.join("~", ".ssh", arg)
        paths += sorted(glob.glob(os.path.expanduser(pattern)))  # no match: nothing included, as in ssh
    return paths


# ---------------------------------------------------------------------------------- matching


def _pattern_matches(value: str, pattern: str) -> bool:
    """OpenSSH's match_pattern: '*' any run, '?' one character, everything else literal."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, flags=re.DOTALL) is not None


def _pattern_list_matches(value: str, patterns: str, *, lower: bool = False) -> bool:
    """OpenSSH's match_pattern_list: comma-separated, '!' negates, a negated match wins."""
    if lower:
        value, patterns = value.lower(), patterns.lower()
    positive = False
    for pattern in patterns.split(","):
        negated = pattern.startswith("!")
        if _pattern_matches(value, pattern[1:] if negated else pattern):
            if negated:
                return False
            positive = True
    return positive


def _host_line_matches(args: list[str], host: str, where: str) -> bool:
    active = False
    for arg in args:
        if not arg:
            raise InputError(f"{where}: empty Host pattern", hint=_HINT)
        negated = arg.startswith("!")
        if _pattern_matches(host, arg[1:] if negated else arg):
            if negated:
                return False
            active = True
    return active


def _match_line(args: list[str], ctx: _Context, options: _Options, where: str, *, evaluate: bool
                ) -> tuple[bool, bool]:
    """(does the block apply, does it ask for the final pass) for ``Match ARGS``."""
    result, wants_final, i, count = True, False, 0, 0
    while i < len(args):
        raw = args[i]
        negate = raw.startswith("!")
        criterion = raw[1:].lower() if negate else raw.lower()
        i += 1
        if criterion == "all":
            if count or i < len(args):
                raise InputError(f"{where}: Match all cannot be combined with other criteria", hint=_HINT)
            return (result and not negate), wants_final
        count += 1
        if criterion in ("canonical", "final"):
            wants_final |= criterion == "final"
            if ctx.final == negate:
                result = False
            continue
        if i >= len(args):
            raise InputError(f"{where}: Match {criterion} needs an argument", hint=_HINT)
        arg = args[i]
        i += 1
        if criterion in ("host", "originalhost"):
            value = ctx.original if criterion == "originalhost" else _match_host(options, ctx)
            matched = _pattern_list_matches(value, arg, lower=True)
        elif criterion == "user":
            matched = _pattern_list_matches(options.values.get("user") or getpass.getuser(), arg)
        elif criterion == "localuser":
            matched = _pattern_list_matches(getpass.getuser(), arg)
        elif criterion == "exec":
            if not (result and evaluate):  # ssh skips the command once the line cannot match
                continue
            matched = _exec_matches(arg, ctx, options, where)
        else:
            raise InputError(f"{where}: Match {criterion} is not supported by dfo",
                             hint="dfo reads all, host, originalhost, user, localuser, exec, canonical and final")
        if matched == negate:
            result = False
    if count == 0:
        raise InputError(f"{where}: Match needs a criterion", hint=_HINT)
    return result, wants_final


def _match_host(options: _Options, ctx: _Context) -> str:
    if ctx.final or "hostname" not in options.values:
        return ctx.host
    return _percent_expand(options.values["hostname"], {"%": "%", "h": ctx.host}, options.where["hostname"])


def _exec_matches(command: str, ctx: _Context, options: _Options, where: str) -> bool:
    """``Match exec``: the user's own command, run as ssh runs it (their shell, stdin and stdout closed)."""
    host = _match_host(options, ctx)
    port = options.values.get("port", "22")
    user = options.values.get("user") or getpass.getuser()
    local = socket.gethostname()
    tokens = {"%": "%", "C": hashlib.sha1(f"{local}{host}{port}{user}".encode()).hexdigest(),
              "L": local.split(".")[0], "d": os.path.expanduser("~"), "h": host, "k": host, "l": local,
              "n": ctx.original, "p": port, "r": user, "u": getpass.getuser()}
    line = _percent_expand(command, tokens, where)
    shell = os.environ.get("SHELL") or "/bin/sh"
    try:
        return subprocess.run([shell, "-c", line], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(f"{where}: Match exec {command!r} could not run: {exc}") from None


# ---------------------------------------------------------------------------------- expansion


def _percent_expand(value: str, tokens: dict[str, str], where: str | None) -> str:
    out, i = [], 0
    while i < len(value):
        if value[i] != "%":
            out.append(value[i])
            i += 1
            continue
        key = value[i + 1] if i + 1 < len(value) else ""
        if key not in tokens:
            raise InputError(f"{where or 'ssh_config'}: unknown token %{key} in {value!r}",
                             hint="ssh accepts %% and the tokens of ssh_config(5) TOKENS for this keyword")
        out.append(tokens[key])
        i += 2
    return "".join(out)


def _dollar_expand(value: str, where: str | None) -> str:
    def env(m: re.Match) -> str:
        if m.group(1) not in os.environ:
            raise InputError(f"{where or 'ssh_config'}: environment variable {m.group(1)} in {value!r} is not set")
        return os.environ[m.group(1)]

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", env, value)
