"""MATH-500 (HuggingFaceH4/MATH-500, test): the problem and z-lab's "reason step by step … \\boxed{}" suffix;
its subject is the second level of the results."""

from remote_payload.inputs.datasets.adapter import BOXED, Adapter, text_field

ADAPTER = Adapter(
    name="math500", hub_id="HuggingFaceH4/MATH-500", config=None, split="test", splits=("test",),
    fields=("problem", "unique_id"),
    turns=lambda row: [text_field(row, "problem") + BOXED],
    row_id=lambda row, i: str(row["unique_id"]), zlab_samples=128,
    category=lambda row: row["subject"] if isinstance(row.get("subject"), str) else None,
)
