"""GSM8K (openai/gsm8k, main, test): the question and z-lab's "reason step by step … \\boxed{}" suffix.

Its rows have no id field: a row's id is its position in the split (0-based), so keep the export's order.
"""

from remote_payload.inputs.datasets.adapter import BOXED, Adapter, text_field

ADAPTER = Adapter(
    name="gsm8k", hub_id="openai/gsm8k", config="main", split="test", splits=("test", "train"),
    fields=("question", "answer"),
    # dflash/benchmark.py: "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    turns=lambda row: [text_field(row, "question") + BOXED],
    row_id=lambda row, i: str(i), zlab_samples=128,
)
