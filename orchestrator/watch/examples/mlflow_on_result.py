"""--on-result for MLflow: each evaluated checkpoint's τ as MLflow metrics at its training step.

    dfo watch … --on-result 'python3 /path/to/dfo/orchestrator/watch/examples/mlflow_on_result.py'

Run it with a Python that has ``mlflow`` (``pip install mlflow``) and MLFLOW_TRACKING_URI set. The result JSON
arrives on stdin (docs/watch.md). Set ``MLFLOW_RUN_ID`` to the trainer's run to put τ beside the loss
(MLflow takes metrics for a run from any process, at any step); without it, a run named ``dfo-<series>`` in
experiment ``$MLFLOW_EXPERIMENT_NAME`` (default ``dfo``) is found or made. The metric names are the
TensorBoard tags `dfo watch --tensorboard` writes ('/' is kept: MLflow allows it). A failed checkpoint logs
nothing.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from wandb_on_result import metrics  # noqa: E402 - the same names for every tracker


def main():
    result = json.load(sys.stdin)
    if result.get("status") != "done":
        return 0
    import mlflow

    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        name = "dfo-" + str(result["series"])
        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", "dfo"))
        found = mlflow.search_runs(filter_string="tags.mlflow.runName = '%s'" % name.replace("'", ""),
                                   output_format="list", max_results=1)
        run_id = found[0].info.run_id if found else None
        if run_id is None:
            with mlflow.start_run(run_name=name) as run:
                run_id = run.info.run_id
    with mlflow.start_run(run_id=run_id):
        mlflow.log_metrics(metrics(result), step=int(result["step"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
