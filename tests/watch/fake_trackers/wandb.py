"""A stand-in for wandb with the calls wandb_on_result.py makes; each call is a JSON line in $FAKE_TRACKER_LOG."""

import json
import os


def _log(*call):
    with open(os.environ["FAKE_TRACKER_LOG"], "a") as fh:
        fh.write(json.dumps(call) + "\n")


class _Run:
    def define_metric(self, name, step_metric=None):
        _log("define_metric", name, step_metric)

    def log(self, data):
        _log("log", data)

    def finish(self):
        _log("finish")


def init(project=None, id=None, resume=None, name=None):  # noqa: A002 - wandb's own keyword
    _log("init", {"project": project, "id": id, "resume": resume, "name": name})
    return _Run()
