"""MBPP (google-research-datasets/mbpp, sanitized, test): the raw prompt, as z-lab sends it."""

from remote_payload.inputs.datasets.adapter import Adapter, text_field

ADAPTER = Adapter(
    name="mbpp", hub_id="google-research-datasets/mbpp", config="sanitized", split="test",
    splits=("test", "train", "validation", "prompt"), fields=("task_id", "prompt"),
    turns=lambda row: [text_field(row, "prompt")],  # dflash/benchmark.py: "format": lambda x: x["prompt"]
    row_id=lambda row, i: str(row["task_id"]), zlab_samples=128,
)
