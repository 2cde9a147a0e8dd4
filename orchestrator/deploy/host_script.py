# Host side of `dfo deploy`: content-addressed payload releases with an atomic switch.
#
# Layout under WORKDIR:  releases/<id>/...  (one verified payload each, with MANIFEST.json)
#                        payload           -> releases/<id>   (symlink; what jobs run)
#                        payload.previous  -> releases/<id>   (for `dfo deploy --rollback`)
import json
import os
import shutil
import time
import uuid


def _release_of(link):
    try:
        return os.path.basename(os.readlink(link))
    except OSError:
        return None


def _verify(directory, files):
    bad = []
    for rel, meta in files.items():
        path = _confine(directory, rel)  # names from the controller: confined here too
        if not os.path.isfile(path) or _sha256(path) != meta["sha256"]:
            bad.append(rel)
    return bad


def state(workdir):
    releases = os.path.join(workdir, "releases")
    current = _release_of(os.path.join(workdir, "payload"))
    files = {}
    if current:
        root = os.path.join(releases, current)
        for base, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for n in names:
                if n.endswith(".pyc") or (base == root and n == "MANIFEST.json"):
                    continue
                path = os.path.join(base, n)
                files[os.path.relpath(path, root)] = _sha256(path)
    return {
        "current": current,
        "previous": _release_of(os.path.join(workdir, "payload.previous")),
        "files": files,
        "releases": sorted(os.listdir(releases)) if os.path.isdir(releases) else [],
    }


def prepare(workdir, release, files):
    """Staging dir holding every file we can reuse from existing releases; returns what is still needed."""
    releases = os.path.join(workdir, "releases")
    os.makedirs(releases, exist_ok=True)
    final = os.path.join(releases, release)
    if os.path.isdir(final) and not _verify(final, files):
        return {"staging": final, "need": [], "reused_release": True}
    staging = os.path.join(releases, ".staging-%s-%s" % (release, uuid.uuid4().hex[:8]))
    os.makedirs(staging)
    sources = []
    for link in ("payload", "payload.previous"):
        rel = _release_of(os.path.join(workdir, link))
        if rel and os.path.isdir(os.path.join(releases, rel)):
            sources.append(os.path.join(releases, rel))
    need = []
    for rel, meta in sorted(files.items()):
        dest = _confine(staging, rel)
        for src_root in sources:
            src = os.path.join(src_root, rel)
            if os.path.isfile(src) and _sha256(src) == meta["sha256"]:
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copy2(src, dest)
                break
        else:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            need.append(rel)
    return {"staging": staging, "need": need, "reused_release": False}


def commit(workdir, release, files, staging):
    """Verify the staging dir against the manifest, publish it, switch `payload` atomically."""
    releases = os.path.join(workdir, "releases")
    final = os.path.join(releases, release)
    bad = _verify(staging, files)
    if bad:
        raise RuntimeError("hash mismatch after upload for %s (staging kept at %s)" % (", ".join(bad[:10]), staging))
    if staging != final:
        with open(os.path.join(staging, "MANIFEST.json"), "w") as fh:
            json.dump({"release": release, "files": files}, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        if os.path.isdir(final):
            # Never delete a release in place: it may be what `payload` points at or what a running job
            # imports from. Set it aside (pruned once no job runs) and publish the verified one.
            os.rename(final, os.path.join(releases, ".replaced-%s-%s" % (release, uuid.uuid4().hex[:8])))
        os.rename(staging, final)
    link = os.path.join(workdir, "payload")
    old = _release_of(link)
    if old != release:
        _switch(link, os.path.join("releases", release))
        if old:
            _switch(os.path.join(workdir, "payload.previous"), os.path.join("releases", old))
    _prune(workdir)
    return {"release": release, "previous": _release_of(os.path.join(workdir, "payload.previous"))}


def rollback(workdir):
    link, prev = os.path.join(workdir, "payload"), os.path.join(workdir, "payload.previous")
    current, previous = _release_of(link), _release_of(prev)
    if not previous or not os.path.isdir(os.path.join(workdir, "releases", previous)):
        raise RuntimeError("no previous release to roll back to in %s" % workdir)
    _switch(link, os.path.join("releases", previous))
    if current:
        _switch(prev, os.path.join("releases", current))
    return {"release": previous, "previous": current}


def _switch(link, target):
    tmp = "%s.tmp-%s" % (link, uuid.uuid4().hex[:8])
    os.symlink(target, tmp)
    os.replace(tmp, link)  # rename(2) over the old link: readers see the old or the new, never nothing


def _releases_in_use(workdir):
    """(release names that running jobs run in or refer to, whether any job runs at all)."""
    releases = os.path.realpath(os.path.join(workdir, "releases"))
    jobs = os.path.join(workdir, "jobs")
    used, running = set(), False
    for job_id in os.listdir(jobs) if os.path.isdir(jobs) else []:
        job_dir = os.path.join(jobs, job_id)
        spec = _read_json(os.path.join(job_dir, "job.json"))
        if not isinstance(spec, dict) or os.path.exists(os.path.join(job_dir, "exit.json")):
            continue
        pid = (_read_json(os.path.join(job_dir, "pid.json")) or {}).get("pid")
        if not (_pid_alive(pid) if pid else time.time() - (spec.get("created") or 0) < 60):
            continue
        running = True
        for ref in [spec.get("cwd_real") or spec.get("cwd") or ""] + list(spec.get("argv") or []):
            real = os.path.realpath(str(ref))
            if real.startswith(releases + os.sep):
                used.add(real[len(releases) + 1:].split(os.sep)[0])
    return used, running


def _prune(workdir):
    """Remove releases nothing needs: never `payload`, `payload.previous`, a release a running job uses, or
    a replaced release while any job runs."""
    releases = os.path.join(workdir, "releases")
    keep = {_release_of(os.path.join(workdir, "payload")), _release_of(os.path.join(workdir, "payload.previous"))}
    used, running = _releases_in_use(workdir)
    for name in os.listdir(releases):
        if name in keep or name in used or name.startswith(".staging-"):
            continue
        if name.startswith(".replaced-") and running:
            continue
        shutil.rmtree(os.path.join(releases, name), ignore_errors=True)
