"""Edit inventory.yaml in place without disturbing anything else in it.

Edits are splices into the original text at the positions the YAML parser reports, so comments, key
order, blank lines and quoting outside the edited value stay byte-for-byte. Every edit is validated as a
whole inventory before it is written, and written atomically.
"""

from __future__ import annotations

import difflib
import json
import os
import tempfile
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import HOST_NAME_RE, Host, Inventory, Where, parse_inventory


def cli_value(field_path: list[str], raw: str) -> Any:
    """A command-line VALUE typed by the field's schema: a string field takes it as written (`1` stays "1",
    `eval host: A6000` stays a sentence) unless it is a quoted YAML string (`"/data/x y"`, unquoted); any
    other field reads it as YAML (`2222`, `true`, `[eval]`)."""
    if not _is_string_field(field_path):
        return parse_yaml_value(raw)
    if raw[:1] in ("'", '"'):
        quoted = parse_yaml_value(raw)
        if isinstance(quoted, str):
            return quoted
    return raw


def parse_yaml_value(raw: str) -> Any:
    """A command-line VALUE read as a YAML scalar/flow value: `2222` is an int, `true` a bool, `[a, b]` a list."""
    try:
        value = YAML(typ="safe").load(raw)
    except YAMLError:
        return raw
    return raw if value is None and raw.strip() not in ("null", "~") else value


def _is_string_field(field_path: list[str]) -> bool:
    model: type[BaseModel] = Host
    for depth, key in enumerate(field_path):
        info = model.model_fields.get(key)
        if info is None:
            return False  # an unknown field: the validation names it
        last = depth == len(field_path) - 1
        if key == "env" and depth == len(field_path) - 2:
            return True  # an env value is a string
        if last:
            return _only_strings(info.annotation)
        nested = info.annotation
        if not (isinstance(nested, type) and issubclass(nested, BaseModel)):
            return False
        model = nested
    return False


def _only_strings(annotation: Any) -> bool:
    """Is every non-None form of ANNOTATION a str (``str``, ``str | None``, ``Annotated[str, …]``)?"""
    if typing.get_origin(annotation) is typing.Annotated:
        return _only_strings(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        arms = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(arms) and all(_only_strings(a) for a in arms)
    return annotation is str


def render_value(value: Any) -> str:
    """YAML text for a value, plain when that round-trips, else JSON-style (valid YAML) quoting."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(render_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{render_value(str(k))}: {render_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    try:
        if text and "#" not in text and YAML(typ="safe").load(text) == text:
            return text
    except YAMLError:
        pass
    return json.dumps(text)


def _compose(text: str) -> MappingNode:
    root = YAML(typ="rt").compose(text)
    if not isinstance(root, MappingNode):
        raise InputError("the inventory's top level is not a mapping; fix it by hand first")
    return root


def _child(node: MappingNode, key: str) -> tuple[ScalarNode, Node] | None:
    for k, v in node.value:
        if k.value == key:
            return k, v
    return None


def _last_line(node: Node) -> int:
    """0-based line where a node's text ends (block collections: their last descendant)."""
    if isinstance(node, MappingNode) and not node.flow_style and node.value:
        return _last_line(node.value[-1][1])
    if isinstance(node, SequenceNode) and not node.flow_style and node.value:
        return _last_line(node.value[-1])
    end = node.end_mark
    # A block scalar's end mark sits at column 0 of the line after it.
    return end.line - 1 if end.column == 0 and end.line > node.start_mark.line else end.line


def _hosts(root: MappingNode) -> MappingNode:
    found = _child(root, "hosts")
    if found is None or not isinstance(found[1], MappingNode) or found[1].flow_style:
        raise InputError("the inventory has no block 'hosts:' mapping to edit; fix it by hand first")
    return found[1]


def _host(root: MappingNode, name: str, known: list[str]) -> MappingNode:
    found = _child(_hosts(root), name)
    if found is None:
        raise InputError(f"unknown host {name!r}", hint=f"known hosts: {', '.join(known) or '(none)'}")
    if not isinstance(found[1], MappingNode):
        raise InputError(f"host {name!r} is not a mapping of fields; edit it by hand")
    return found[1]


def _lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return lines


def set_field(text: str, host: str, field_path: list[str], value: Any, known_hosts: list[str]) -> str:
    root = _compose(text)
    node: MappingNode = _host(root, host, known_hosts)
    for depth, key in enumerate(field_path):
        found = _child(node, key)
        if found is None:
            if node.flow_style:  # `paths: {models: /m}`: the new field goes inside the braces, in their style
                return _insert_flow_field(text, node, field_path[depth:], value)
            return _insert_fields(text, node, field_path[depth:], value)
        key_node, value_node = found
        if depth < len(field_path) - 1:
            if not isinstance(value_node, MappingNode):
                raise InputError(f"hosts.{host}.{'.'.join(field_path[:depth + 1])} is not a mapping, so it has no "
                                 f"field {field_path[depth + 1]!r}",
                                 hint="set it whole, or edit the file by hand")
            node = value_node
            continue
        if isinstance(value_node, (MappingNode, SequenceNode)) and not value_node.flow_style and value_node.value:
            raise InputError(
                f"hosts.{host}.{'.'.join(field_path)} is a block "
                f"{'list' if isinstance(value_node, SequenceNode) else 'mapping'}",
                hint="set its items one by one, or edit the file by hand",
            )
        start, end = value_node.start_mark.index, value_node.end_mark.index
        if isinstance(value_node, ScalarNode) and value_node.style in ("|", ">"):
            raise InputError(f"hosts.{host}.{'.'.join(field_path)} is a block scalar; edit it by hand")
        if start == end:  # `key:` with an empty value
            start = end = key_node.end_mark.index + 1
            return text[:start] + " " + render_value(value) + text[end:]
        return text[:start] + render_value(value) + text[end:]
    raise InputError("empty field path")


def _insert_fields(text: str, parent: MappingNode, keys: list[str], value: Any) -> str:
    indent = parent.value[0][0].start_mark.column if parent.value else 4
    step = 2
    new = []
    for i, key in enumerate(keys[:-1]):
        new.append(" " * (indent + i * step) + f"{key}:\n")
    new.append(" " * (indent + (len(keys) - 1) * step) + f"{keys[-1]}: {render_value(value)}\n")
    lines = _lines(text)
    at = _last_line(parent) + 1
    return "".join(lines[:at] + new + lines[at:])


def _insert_flow_field(text: str, parent: MappingNode, keys: list[str], value: Any) -> str:
    """``KEY: VALUE`` (nested keys as ``{K2: VALUE}``) added as the last entry of a flow mapping ``{…}``."""
    entry = render_value(value)
    for key in reversed(keys[1:]):
        entry = "{" + f"{key}: {entry}" + "}"
    entry = f"{keys[0]}: {entry}"
    if parent.value:
        at = parent.value[-1][1].end_mark.index
        return text[:at] + ", " + entry + text[at:]
    close = text.rindex("}", parent.start_mark.index, parent.end_mark.index)
    return text[:close] + entry + text[close:]


def add_host(text: str, name: str, fields: dict[str, Any]) -> str:
    if not HOST_NAME_RE.match(name):
        raise InputError(f"invalid host name {name!r}: use letters, digits, '.', '_' or '-'")
    root = _compose(text)
    hosts = _hosts(root)
    if _child(hosts, name) is not None:
        raise InputError(f"host {name!r} already exists", hint="use `dfo inventory set` to change it")
    host_indent = hosts.value[0][0].start_mark.column if hosts.value else 2
    field_indent = host_indent + 2
    if hosts.value and isinstance(hosts.value[0][1], MappingNode) and hosts.value[0][1].value:
        field_indent = hosts.value[0][1].value[0][0].start_mark.column
    block = ["\n", " " * host_indent + f"{name}:\n"]
    block += [" " * field_indent + f"{k}: {render_value(v)}\n" for k, v in fields.items() if v is not None]
    lines = _lines(text)
    at = _last_line(hosts) + 1
    return "".join(lines[:at] + block + lines[at:])


def remove_host(text: str, name: str, known_hosts: list[str]) -> str:
    root = _compose(text)
    hosts = _hosts(root)
    found = _child(hosts, name)
    if found is None:
        raise InputError(f"unknown host {name!r}", hint=f"known hosts: {', '.join(known_hosts) or '(none)'}")
    key, value = found
    lines = _lines(text)
    first, last = key.start_mark.line, _last_line(value)
    # Drop one separating blank line so the file does not accumulate gaps.
    if first > 0 and not lines[first - 1].strip() and (last + 1 >= len(lines) or not lines[last + 1].strip()):
        first -= 1
    return "".join(lines[:first] + lines[last + 1:])


def write_inventory(path: Path, new_text: str, old_text: str | None = None) -> Inventory:
    """Validate the edited text as a whole inventory, then replace the file atomically.

    Errors name lines of the file as it is (OLD_TEXT, the text the edit was made from), not of the unwritten
    candidate. A symlinked inventory stays a symlink: the file it points to is replaced (in its own folder),
    and that folder is fsynced so the rename survives a crash."""
    try:
        inventory = parse_inventory(new_text, path, None if old_text is None else _real_lines(path, old_text, new_text))
    except InputError as exc:
        unchanged = f"nothing was written: {path} is unchanged"
        raise InputError(exc.message, hint=f"{exc.hint}; {unchanged}" if exc.hint else unchanged) from None
    path = Path(os.path.realpath(path))
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".dfo-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(new_text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return inventory


def _real_lines(path: Path, old_text: str, new_text: str) -> Where:
    """Where a line of the edited text is in the file as it is: the same line, the line the edit changes
    ("edited"), or the place a new line would go."""
    old, new = old_text.splitlines(), new_text.splitlines()
    opcodes = difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes()

    def where(line: int) -> str:
        index = line - 1
        for tag, i1, i2, j1, j2 in opcodes:
            if not j1 <= index < j2:
                continue
            if tag == "equal":
                return f"{path}:{i1 + index - j1 + 1}"
            if tag == "replace":
                return f"{path}:{min(i1 + index - j1, i2 - 1) + 1} (as edited)"
            return f"{path} (new line after line {i1})"
        return f"{path}:{line}"

    return where


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
