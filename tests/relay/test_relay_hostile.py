"""A relay from a source host that lies, to a destination folder that someone else can write into.

The hostile source is a real sandbox host whose Python is a wrapper: it runs the relay's host program
with a few of its functions replaced (a listing with names that leave the folder, a setuid mode, frames
forged into the pipe to the writer). Each test shows the attack refused with a clear error and asserts
on the filesystem that nothing was written outside the destination root.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_runner import dfo
from ruamel.yaml import YAML

pytestmark = pytest.mark.sshd
MiB = 1 << 20

_WRAPPER = '''#!{python}
# A hostile python3 for the relay's stream processes: the host program runs with {evil} appended
# before its call line. Anything else (the control plane's one-shot calls) runs honestly.
import os, sys
if len(sys.argv) == 3 and sys.argv[1] == "-c" and "exec(b)" in sys.argv[2]:
    def rd(n):
        b = b""
        while len(b) < n:
            c = os.read(0, n - len(b))
            if not c:
                os._exit(3)
            b += c
        return b
    code = rd(int(rd(10)))
    head, _, call = code.rstrip(b"\\n").rpartition(b"\\n")
    with open({evil!r}, "rb") as fh:
        code = head + b"\\n" + fh.read() + b"\\n" + call + b"\\n"
    exec(compile(code, "<hostile>", "exec"), {{"__name__": "__main__"}})
else:
    os.execv({python!r}, [{python!r}] + sys.argv[1:])
'''


def hostile_inventory(box, tmp_path: Path, evil: str) -> Path:
    """The sandbox's inventory with kpro6's python replaced by a wrapper that runs EVIL in the host program."""
    yaml = YAML()
    data = yaml.load(box.inventory_path.read_text())
    real = str(data["hosts"]["kpro6"]["python"])
    evil_file = tmp_path / "evil.py"
    evil_file.write_text(textwrap.dedent(evil))
    wrapper = tmp_path / "hostile-python3"
    wrapper.write_text(_WRAPPER.format(python=real, evil=str(evil_file)))
    wrapper.chmod(0o755)
    data["hosts"]["kpro6"]["python"] = str(wrapper)
    out = tmp_path / "inventory-hostile.yaml"
    with open(out, "w") as fh:
        yaml.dump(data, fh)
    return out


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


@pytest.fixture
def dirs(sandbox, request):
    """(source folder with model.bin, destination parent, destination root): the root is where the relay
    may write; its parent is watched for anything written beside it."""
    name = request.node.name.replace("[", "_").replace("]", "")
    src = sandbox.hosts["kpro6"].checkpoints / name / "ckpt"
    parent = sandbox.hosts["ct129"].checkpoints / name / "a" / "b"
    src.mkdir(parents=True)
    parent.mkdir(parents=True)
    (src / "model.bin").write_bytes(os.urandom(MiB + 3))
    return src, parent, parent / "ckpt"


NAMES = {
    "dotdot": "../../escaped.bin",
    "inner-dotdot": "sub/../../escaped.bin",
    "absolute": "/tmp/dfo-relay-absolute-escape.bin",
    "nul": "model.bin\x00.evil",
    "empty": "",
    "dot": "./model.bin",
}


@pytest.mark.parametrize("kind", sorted(NAMES))
def test_source_lying_about_names_writes_nothing_outside_the_root(sandbox, dirs, tmp_path, kind):
    src, parent, root = dirs
    rel = NAMES[kind]
    inventory = hostile_inventory(sandbox, tmp_path, f"""
        _honest_source_facts = source_facts
        def source_facts(path, **kw):
            snap = _honest_source_facts(path, **kw)
            for f in snap.get("files", []):
                f["rel"] = {rel!r}
            return snap
    """)
    if ".." in rel:  # the source serves model.bin under that name (a hard link: same identity), as a real
        served = Path(os.path.normpath(src / rel))  # attacker would; without the checks it lands outside
        (src / "sub").mkdir(exist_ok=True)  # "sub/.." must exist for the kernel to walk it
        served.unlink(missing_ok=True)
        os.link(src / "model.bin", served)
    outside = parent.parent.parent  # the test's folder on ct129: root's grandparent
    before = tree(outside)
    proc = dfo(sandbox, "relay-checkpoint", f"kpro6:{src}", f"ct129:{parent}/", inventory=inventory)
    assert proc.returncode != 0
    said = " ".join(proc.stderr.split())
    assert "Traceback" not in said and "kpro6" in said and "refused source file name" in said, said
    assert tree(outside) == before  # not even the root was created
    assert not Path("/tmp/dfo-relay-absolute-escape.bin").exists()


def test_source_mode_is_never_applied_as_such(sandbox, dirs, tmp_path):
    src, parent, root = dirs
    (src / "run.sh").write_bytes(b"#!/bin/sh\n")
    (src / "run.sh").chmod(0o700)
    inventory = hostile_inventory(sandbox, tmp_path, """
        _honest_source_facts = source_facts
        def source_facts(path, **kw):
            snap = _honest_source_facts(path, **kw)
            for f in snap.get("files", []):
                f["mode"] = 0o6666 if f["rel"] == "model.bin" else f["mode"]
            return snap
    """)
    proc = dfo(sandbox, "relay-checkpoint", f"kpro6:{src}", f"ct129:{parent}/", "--json", inventory=inventory)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((root / "model.bin").stat().st_mode) == 0o644  # no setuid, no group/world write
    assert stat.S_IMODE((root / "run.sh").stat().st_mode) == 0o755    # executable stays executable


FORGERIES = {
    # A writer command the source made up: it does not know the key the controller gave the writer.
    "forged-command": "_write_all(1, seal(b'x' * 32, 0, 'publish', {'root': '/tmp', 'rel': 'forged-by-source', "
                      "'size': 0, 'mode': 420, 'manifest': None}))",
    # Bytes aimed past the end of the open file.
    "data-off-grid": "_write_all(1, range_frame(DATA, 0, 1 << 40, 16) + b'x' * 16)",
    # A reply that would smuggle an extra line ("ack ...") to the controller.
    "line-injection": "_b = b'{}\\nack 0 0 1048579 x'; _write_all(1, REPLY + struct.pack(LEN_FMT, len(_b)) + _b)",
}


@pytest.mark.parametrize("kind", sorted(FORGERIES))
def test_frames_forged_into_the_pipe_are_refused_by_the_writer(sandbox, dirs, tmp_path, kind):
    src, parent, _ = dirs
    inventory = hostile_inventory(sandbox, tmp_path, f"""
        _honest_open = _Reader.open
        def _hostile_open(self, spec):
            {FORGERIES[kind]}
            return _honest_open(self, spec)
        _Reader.open = _hostile_open
    """)
    outside = parent.parent.parent
    before = tree(outside)
    proc = dfo(sandbox, "relay-checkpoint", f"kpro6:{src}/model.bin", f"ct129:{parent}/", inventory=inventory)
    assert proc.returncode == 1
    said = " ".join(proc.stderr.split())
    assert "Traceback" not in said and "ct129" in said, said
    assert any(w in said for w in ("bad seal", "does not fit", "line break")), said
    assert not (parent / "model.bin").exists() and not Path("/tmp/forged-by-source").exists()
    assert tree(outside) - before <= {"a/b/model.bin.dfo-partial", "a/b/model.bin.dfo-partial.state"}


def test_symlink_planted_at_the_partial_name_is_not_written_through(sandbox, paths_for_links):
    src, dst = paths_for_links
    data = os.urandom(2 * MiB)
    (src / "model.bin").write_bytes(data)
    victim = dst.parent / "victim.txt"
    victim.write_bytes(b"v" * len(data))  # the same size, so a resume would take it for the partial
    st = (src / "model.bin").stat()
    header = {"dfo_relay": 1, "chunk_size": 4 * MiB, "size": st.st_size,
              "source": {"host": "kpro6", "path": str(src / "model.bin"), "size": st.st_size,
                         "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}}
    (dst / "model.bin.dfo-partial.state").write_text(json.dumps(header, sort_keys=True) + "\ndone 0 -\n")
    os.symlink(victim, dst / "model.bin.dfo-partial")
    proc = dfo(sandbox, "relay-checkpoint", f"kpro6:{src}/model.bin", f"ct129:{dst}/", "--json")
    assert proc.returncode == 0, proc.stderr
    assert victim.read_bytes() == b"v" * len(data)
    assert (dst / "model.bin").read_bytes() == data and not (dst / "model.bin").is_symlink()


@pytest.fixture
def paths_for_links(sandbox, request):
    src = sandbox.hosts["kpro6"].checkpoints / request.node.name / "src"
    dst = sandbox.hosts["ct129"].checkpoints / request.node.name / "dst"
    src.mkdir(parents=True)
    dst.mkdir(parents=True)
    return src, dst


def test_symlink_leaving_the_source_tree_is_refused_by_name(sandbox, paths_for_links):
    src, dst = paths_for_links
    secret = src.parent / "id_ed25519"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (src / "model.bin").write_bytes(os.urandom(1000))
    os.symlink("model.bin", src / "inside-link.bin")  # stays in the tree: followed
    ok = dfo(sandbox, "relay-checkpoint", f"kpro6:{src}", f"ct129:{dst}/ok/", "--json")
    assert ok.returncode == 0, ok.stderr
    assert (dst / "ok" / "src" / "inside-link.bin").read_bytes() == (src / "model.bin").read_bytes()

    os.symlink(secret, src / "leak.bin")
    proc = dfo(sandbox, "relay-checkpoint", f"kpro6:{src}", f"ct129:{dst}/leak/")
    assert proc.returncode == 2
    said = " ".join(proc.stderr.split())
    assert "leak.bin" in said and "lead out of it" in said and "Traceback" not in said
    assert not (dst / "leak").exists()


# ----------------------------------------------------------------------------------- the writer checks itself


def _local_writer(tmp_path: Path):
    """The relay's writer run locally, fed sealed commands (as if a confused controller sent them)."""
    from orchestrator.relay import protocol as wire
    from orchestrator.relay.processes import BOOT, stream_prelude

    key = os.urandom(32)
    proc = subprocess.Popen([sys.executable, "-c", BOOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=tmp_path)
    proc.stdin.write(stream_prelude("writer", {"key": key.hex()}))
    proc.stdin.flush()
    assert proc.stdout.readline().startswith(b"hello ")
    seq = iter(range(1000))

    def send(op: str, args: dict, raw: bytes | None = None) -> str:
        proc.stdin.write(raw or wire.seal(key, next(seq), op, args))
        proc.stdin.flush()
        return proc.stdout.readline().decode()

    send.key = key  # type: ignore[attr-defined]
    return proc, send


@pytest.mark.parametrize("rel", ["../escaped.bin", "/etc/escaped.bin", "a/../../escaped.bin", "a//b"])
def test_writer_confines_names_itself(tmp_path, rel):
    root = tmp_path / "root"
    root.mkdir()
    proc, send = _local_writer(tmp_path)
    try:
        answer = send("open", {"root": str(root), "rel": rel, "size": 10, "chunk_size": 4 * MiB, "hash": "chunk",
                               "prepare": {"header": {}, "reset": True}})
        assert answer.startswith("error refused"), answer
    finally:
        proc.kill()
        proc.wait()
    assert not (tmp_path / "escaped.bin").exists() and list(root.iterdir()) == []


def test_writer_never_writes_through_a_linked_folder(tmp_path):
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    os.symlink(root / "real", root / "linked")  # inside the root, but a link all the same
    proc, send = _local_writer(tmp_path)
    try:
        answer = send("open", {"root": str(root), "rel": "linked/x.bin", "size": 10, "chunk_size": 4 * MiB,
                               "hash": "chunk", "prepare": {"header": {}, "reset": True}})
        assert answer.startswith("error refused") and "symlink" in answer, answer
    finally:
        proc.kill()
        proc.wait()
    assert list((root / "real").iterdir()) == []


@pytest.mark.parametrize("how", ["replayed", "unknown key"])
def test_writer_refuses_replayed_or_unsealed_commands(tmp_path, how):
    from orchestrator.relay import protocol as wire

    proc, send = _local_writer(tmp_path)
    try:
        first = wire.seal(send.key, 0, "facts", {"path": str(tmp_path), "rels": [""]})  # type: ignore[attr-defined]
        assert send("", {}, raw=first).startswith("facts ")
        again = first if how == "replayed" else wire.seal(b"k" * 32, 1, "facts", {"path": "/", "rels": [""]})
        answer = send("", {}, raw=again)
        assert answer.startswith("error protocol a writer command " + ("out of sequence" if how == "replayed"
                                                                          else "with a bad seal")), answer
    finally:
        proc.kill()
        proc.wait()
