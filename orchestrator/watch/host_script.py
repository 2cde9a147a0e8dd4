# Host side of `dfo watch`'s look at a checkpoint folder (orchestrator/watch/probe.py). Stdlib only,
# Python >= 3.8. It only reads: one entry per file or directory in the folder with its size and mtime
# (a directory: the sum and the newest over its files), whether a directory holds weights, and the step
# its metadata records. The controller checks every field of the answer (watch/discovery.py).
import time

_META_FILES = (("trainer_state.json", ("global_step",)), ("dfo-source.json", ("step",)),
               ("config.json", ("training", "step")))
_WEIGHTS = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")


def _meta_step(path):
    for name, keys in _META_FILES:
        value = _read_json(os.path.join(path, name))
        try:
            for key in keys:
                value = value[key]
        except (KeyError, TypeError, IndexError):
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            return {"file": name, "step": value}
    return None


def _describe(path, name):
    st = os.stat(path)
    if not os.path.isdir(path):
        return {"name": name, "is_dir": False, "size": st.st_size, "mtime": st.st_mtime, "mtime_ns": st.st_mtime_ns}
    size, mtime, weights = 0, st.st_mtime, False
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                fs = os.stat(os.path.join(root, f))
            except OSError:
                continue
            size += fs.st_size
            mtime = max(mtime, fs.st_mtime)
            weights = weights or f.endswith(_WEIGHTS)
    return {"name": name, "is_dir": True, "size": size, "mtime": mtime, "has_weights": weights,
            "meta": _meta_step(path)}


def list_folder(folder):
    doc = {"folder": folder, "now": time.time(), "entries": []}
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        return {"folder": folder, "error": "cannot list %s: %s" % (folder, exc.strerror or exc)}
    for name in names:
        try:
            doc["entries"].append(_describe(os.path.join(folder, name), name))
        except OSError:
            pass  # removed while listing: the next look sees the folder as it is then
    return doc


def remove_relayed(root, name):
    """Remove the relayed checkpoint ROOT/NAME and its manifest (the weights were evaluated; the series keeps
    their digests). NAME is confined under ROOT here too: the host does not trust the controller either."""
    import shutil

    for path in (_confine(root, name), _confine(root, name + ".dfo-manifest.json")):
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
    return True


def remove_stripped(root, keys):
    """Remove the stripped copies ROOT/KEY (relay/strip.py's folders, named by a hex key) a relay left behind;
    each KEY is confined under ROOT here too."""
    import re
    import shutil

    removed = []
    for key in keys:
        if not isinstance(key, str) or not re.match(r"^[0-9a-f]{16}$", key):
            raise ValueError("not a strip key: %r" % (key,))
        path = _confine(root, key)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
            removed.append(key)
    return removed
