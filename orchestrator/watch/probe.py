"""List a checkpoint folder on the training host (the only I/O discovery needs).

The script runs with the host's own Python, stdlib only, sent on stdin with the folder as its one
argument (never interpolated into a shell line). It prints one JSON document that
``discovery.parse_listing`` reads.
"""

from __future__ import annotations

import json

from orchestrator.core.errors import HostError
from orchestrator.transport import Connector

LIST_SCRIPT = r'''
import json, os, sys, time

def meta_step(path):
    for name, keys in (("trainer_state.json", ("global_step",)), ("dfo-source.json", ("step",)),
                       ("config.json", ("training", "step"))):
        try:
            with open(os.path.join(path, name)) as fh:
                value = json.load(fh)
            for key in keys:
                value = value[key]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            return {"file": name, "step": value}
    return None

def describe(path, name):
    st = os.stat(path)
    if not os.path.isdir(path):
        return {"name": name, "is_dir": False, "size": st.st_size, "mtime": st.st_mtime}
    size, mtime, weights = 0, st.st_mtime, False
    for root, dirs, files in os.walk(path):
        for f in files:
            try:
                fs = os.stat(os.path.join(root, f))
            except OSError:
                continue
            size += fs.st_size
            mtime = max(mtime, fs.st_mtime)
            weights = weights or f.endswith((".safetensors", ".pt", ".pth", ".bin", ".ckpt"))
    return {"name": name, "is_dir": True, "size": size, "mtime": mtime, "has_weights": weights,
            "meta": meta_step(path)}

folder = sys.argv[1]
doc = {"folder": folder, "now": time.time(), "entries": []}
try:
    names = sorted(os.listdir(folder))
except OSError as exc:
    doc = {"folder": folder, "error": "cannot list %s: %s" % (folder, exc.strerror or exc)}
    names = []
for name in names:
    try:
        doc["entries"].append(describe(os.path.join(folder, name), name))
    except OSError:
        pass  # removed while listing: the next look sees the folder as it is then
print(json.dumps(doc))
'''


def list_folder(connector: Connector, host: str, folder: str) -> dict:
    """The raw listing of ``folder`` on ``host`` (``{"error": …}`` when the folder cannot be listed)."""
    python = connector.inventory.hosts[host].python
    result = connector.session(host).python(LIST_SCRIPT, folder, python=python, timeout=120)
    try:
        doc = json.loads(result.text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise HostError(host, f"listing {folder} printed no JSON: {result.text[-300:]!r}") from None
    doc["host"] = host
    return doc
