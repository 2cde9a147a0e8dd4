"""dfo's built-in prompts (remote_payload/data/prompts.jsonl) as a dataset, so a run can set them beside a
benchmark (the demo: ``--dataset builtin --dataset humaneval@6``). Not z-lab's: each row's user message as
written, in file order; the rows ship with the payload, on the controller and every host alike."""

from remote_payload.inputs.datasets.adapter import Adapter


def _turns(row: dict) -> list[str]:
    return [m["content"] for m in row["messages"] if isinstance(m, dict) and m.get("role") == "user"][:1]


ADAPTER = Adapter(
    name="builtin", hub_id="dfo built-in prompts", config=None, split="all", splits=("all",),
    fields=("id", "messages"), turns=_turns, row_id=lambda row, i: str(row["id"]), zlab_samples=0,
    category=lambda row: row["category"] if isinstance(row.get("category"), str) else None,
    bundled="data/prompts.jsonl",
)
