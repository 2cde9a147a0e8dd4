# Host side of `dfo lint` (orchestrator/lint/operation.py). Stdlib only, Python >= 3.8. It only reads: the JSON
# configs of a drafter or a target folder, and the headers of its safetensors files (8 bytes of little-endian
# length, then that many bytes of JSON); never the weights, except with `deep`, where the bytes of the embedding
# and lm_head tensors are hashed (their byte ranges only). The controller checks every field of the answer
# (lint/replies.py) and turns the facts into findings (lint/rules.py). Also run in-process for a local path.
import struct

_HEADER_MAX = 100 * 2**20  # the safetensors format's own limit on a header
_JSON_MAX = 64 * 2**20  # a config or tokenizer file larger than this is not read
_DRAFTER_JSON = ("config.json", "dfo-source.json", "model.safetensors.index.json", "spec.json")
_TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")
_EMBEDDINGS = ("embed_tokens.weight", "lm_head.weight")
_ADDED_MAX = 20000  # added tokens reported (a real tokenizer has a few hundred)


def _json_doc(path):
    """{"data": the document} / {"error": why}, or None when PATH does not exist."""
    if not os.path.isfile(path):
        return None
    size = os.path.getsize(path)
    if size > _JSON_MAX:
        return {"error": "%d bytes: larger than the %d this check reads" % (size, _JSON_MAX)}
    try:
        with open(path, "rb") as fh:
            return {"data": json.loads(fh.read().decode("utf-8"))}
    except (OSError, UnicodeDecodeError) as exc:
        return {"error": "unreadable: %s" % exc}
    except ValueError as exc:
        return {"error": "not valid JSON: %s" % exc}


def _header(path, keep=None):
    """The safetensors header of PATH: each tensor's dtype, shape and absolute byte range (only the names KEEP
    accepts, when given, with a count of every dtype), or {"error": why} for a file that is not safetensors."""
    out = {"name": os.path.basename(path)}
    try:
        size = os.path.getsize(path)
        out["size"] = size
        if size == 0:
            out["error"] = "the file is empty (0 bytes): not a safetensors file"
            return out
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                out["error"] = "%d bytes: shorter than the 8-byte header length of a safetensors file" % size
                return out
            n = struct.unpack("<Q", head)[0]
            if n == 0 or n > _HEADER_MAX or n > size - 8:
                out["error"] = ("its first 8 bytes give a header of %d bytes in a %d-byte file: not a safetensors "
                                "file" % (n, size))
                return out
            raw = fh.read(n)
    except OSError as exc:
        out["error"] = "unreadable: %s" % exc
        return out
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        out["error"] = "its header is not JSON: not a safetensors file (or a corrupt one)"
        return out
    if not isinstance(header, dict):
        out["error"] = "its header is not a JSON object: not a safetensors file"
        return out
    meta = header.pop("__metadata__", None)
    out["metadata"] = meta if isinstance(meta, dict) else None
    tensors, end = {}, 0
    dtypes = {}  # type: dict
    for name, t in header.items():
        if not isinstance(t, dict) or not isinstance(t.get("data_offsets"), list) or len(t["data_offsets"]) != 2:
            out["error"] = "tensor %r has no data_offsets: a corrupt header" % name[:200]
            return out
        a, b = t["data_offsets"]
        if not isinstance(a, int) or not isinstance(b, int) or not 0 <= a <= b:
            out["error"] = "tensor %r has data_offsets %r: a corrupt header" % (name[:200], t["data_offsets"])
            return out
        end = max(end, b)
        dtype = t.get("dtype")
        dtypes[str(dtype)] = dtypes.get(str(dtype), 0) + 1
        if keep is None or keep(name):
            tensors[name] = {"dtype": dtype, "shape": t.get("shape"), "start": 8 + n + a, "end": 8 + n + b}
    if 8 + n + end > size:
        out["error"] = ("the header's tensors end at byte %d but the file has %d: truncated (re-copy it)"
                        % (8 + n + end, size))
        return out
    out.update(tensors=tensors, dtypes=dtypes, count=len(header))
    return out


def _digest(path, start, end):
    """sha256 of bytes [START, END) of PATH (one tensor's data)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        fh.seek(start)
        left = end - start
        while left > 0:
            chunk = fh.read(min(left, 1 << 22))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def _with_digests(files, folder, deep):
    """Each embedding/lm_head tensor of FILES gets the sha256 of its bytes (DEEP only)."""
    if not deep:
        return
    for f in files:
        for name, t in (f.get("tensors") or {}).items():
            if name.endswith(_EMBEDDINGS):
                t["sha256"] = _digest(os.path.join(folder, f["name"]), t["start"], t["end"])


def _weight_files(folder, index):
    """The safetensors files of FOLDER: those its index names (when it has one), else every *.safetensors."""
    if index is not None and isinstance(index.get("data"), dict):
        wmap = index["data"].get("weight_map")
        if isinstance(wmap, dict):
            return sorted({v for v in wmap.values() if isinstance(v, str) and "/" not in v})
    return sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))


def drafter_facts(path, deep=False):
    """What a drafter's files say: its configs and the headers of its weights (a folder, one .safetensors file
    in a folder, or a training checkpoint file with its spec sidecar)."""
    if not os.path.exists(path):
        return {"missing": True}
    if os.path.isfile(path) and path.endswith(_TORCH_SUFFIXES):
        folder = os.path.dirname(path)
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            magic = fh.read(4)
        sidecars = {}
        for name in ("spec.json", "spec.yaml", "spec.yml"):
            p = os.path.join(folder, name)
            if os.path.isfile(p):
                sidecars[name] = _json_doc(p) if name.endswith(".json") else {"error": "YAML: not read by the lint"}
        return {"kind": "torch", "name": os.path.basename(path), "size": size, "zip": magic == b"PK\x03\x04",
                "json": sidecars}
    only = None
    folder = path
    if os.path.isfile(path):
        folder, only = os.path.dirname(path), os.path.basename(path)
    docs = {}
    for name in _DRAFTER_JSON:
        doc = _json_doc(os.path.join(folder, name))
        if doc is not None:
            docs[name] = doc
    names = [only] if only else _weight_files(folder, docs.get("model.safetensors.index.json"))
    files = []
    for name in names:
        p = os.path.join(folder, name)
        files.append(_header(p) if os.path.isfile(p) else {"name": name, "error": "listed in the index but missing"})
    _with_digests(files, folder, deep)
    torch_files = sorted(n for n in os.listdir(folder) if n.endswith(_TORCH_SUFFIXES))
    return {"kind": "folder" if not only else "file", "json": docs, "files": files, "torch_files": torch_files}


def _template_sha256(folder, tok_cfg):
    """sha256 of the chat template as transformers holds it (chat_template.jinja, else tokenizer_config's)."""
    jinja = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(jinja) and os.path.getsize(jinja) <= _JSON_MAX:
        with open(jinja, encoding="utf-8") as fh:
            text = fh.read()
    else:
        tpl = tok_cfg.get("chat_template") if isinstance(tok_cfg, dict) else None
        if tpl is None:
            return None
        if isinstance(tpl, list):  # named templates: transformers keeps them as a mapping
            tpl = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        text = tpl if isinstance(tpl, str) else json.dumps(tpl, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _tokenizer(folder, probe_ids):
    """The tokenizer's vocabulary size, its added tokens, its special tokens and the pieces of PROBE_IDS."""
    out = {}
    doc = _json_doc(os.path.join(folder, "tokenizer.json"))
    if doc is not None and "error" in doc:
        out["tokenizer_json_error"] = doc["error"]
    data = doc.get("data") if doc else None
    if isinstance(data, dict):
        model = data["model"] if isinstance(data.get("model"), dict) else {}
        vocab = model.get("vocab")
        probes = {}
        if isinstance(vocab, dict):
            out["vocab_size"] = len(vocab)
            wanted = set(probe_ids)
            for piece, tid in vocab.items():
                if tid in wanted:
                    probes[str(tid)] = piece[:200]
        elif isinstance(vocab, list):  # Unigram: [[piece, score], ...] by id
            out["vocab_size"] = len(vocab)
            for tid in probe_ids:
                if isinstance(tid, int) and 0 <= tid < len(vocab) and isinstance(vocab[tid], list):
                    probes[str(tid)] = str(vocab[tid][0])[:200]
        out["regular"] = probes
        added = [a for a in (data.get("added_tokens") or []) if isinstance(a, dict)][:_ADDED_MAX]
        out["added"] = [{"id": a.get("id"), "content": str(a.get("content"))[:200], "special": a.get("special")}
                        for a in added]
    cfg_doc = _json_doc(os.path.join(folder, "tokenizer_config.json"))
    cfg = cfg_doc.get("data") if cfg_doc else None
    if isinstance(cfg, dict):
        decoder = cfg.get("added_tokens_decoder")
        if isinstance(decoder, dict) and "added" not in out:
            out["added"] = [{"id": int(k) if k.isdigit() else k, "content": str((v or {}).get("content"))[:200],
                             "special": (v or {}).get("special")}
                            for k, v in list(decoder.items())[:_ADDED_MAX] if isinstance(v, dict)]
        specials = {}
        for key in ("eos_token", "pad_token", "bos_token", "unk_token"):
            v = cfg.get(key)
            if isinstance(v, dict):
                v = v.get("content")
            if isinstance(v, str):
                specials[key] = v[:200]
        out["special_tokens"] = specials
    out["chat_template_sha256"] = _template_sha256(folder, cfg)
    gen = _json_doc(os.path.join(folder, "generation_config.json"))
    if gen and isinstance(gen.get("data"), dict):
        out["generation_eos"] = gen["data"].get("eos_token_id")
    return out


def target_facts(path, probe_ids=(), deep=False):
    """What a target folder says: config.json, its tokenizer (sizes, added and special tokens, the pieces of
    PROBE_IDS, the chat template's digest) and the embedding and lm_head tensors of its weights' headers."""
    if not os.path.isdir(path):
        return {"missing": True}
    out = {"config": _json_doc(os.path.join(path, "config.json"))}
    out["tokenizer"] = _tokenizer(path, list(probe_ids))
    index = _json_doc(os.path.join(path, "model.safetensors.index.json"))
    names = None
    if index is not None and isinstance(index.get("data"), dict) and isinstance(index["data"].get("weight_map"),
                                                                                  dict):
        wmap = index["data"]["weight_map"]
        names = sorted({f for t, f in wmap.items() if t.endswith(_EMBEDDINGS) and isinstance(f, str)
                        and "/" not in f})
    if names is None:
        names = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    files = []
    for name in names:
        p = os.path.join(path, name)
        files.append(_header(p, keep=lambda t: t.endswith(_EMBEDDINGS)) if os.path.isfile(p)
                     else {"name": name, "error": "listed in the index but missing"})
    _with_digests(files, path, deep)
    out["files"] = files
    return out
