# Host side of `dfo eval`'s own calls (evaluation/operation.py), behind the shared prelude (stdlib only,
# Python >= 3.8): the input checks made before anything is uploaded or relayed, and the prompts upload's
# folder and digest.
import os


def input_facts(paths, workdir, list_gpus):
    """Which of PATHS do not exist, which are files of 0 bytes; the free
    bytes at WORKDIR (when given); the GPUs `nvidia-smi -L` lists (when LIST_GPUS)."""
    facts = {"missing": [p for p in paths if not os.path.exists(p)], "empty": [p for p in paths if _empty(p)]}
    if workdir is not None:
        facts["free_bytes"] = _free_bytes(workdir)
    if list_gpus:
        facts["gpus"] = _command_lines(["nvidia-smi", "-L"])
    return facts


def _empty(path):
    try:
        return os.path.isfile(path) and os.path.getsize(path) == 0
    except OSError:
        return False


def make_folder(path):
    os.makedirs(path, exist_ok=True)
    return True


def file_sha256(path):
    return _sha256(path)
