"""The draws of a run at T > 0 (remote_payload/eval/draws.py): K entries per prompt, each turn of a multi-turn row
following the same draw of the turn before, in the waves the server references are asked in."""

from __future__ import annotations

from remote_payload.eval.draws import expand
from remote_payload.eval.stages import turn_waves
from remote_payload.inputs.prompts import Prompt


def test_each_prompt_becomes_k_draws_and_a_later_turn_follows_its_own_draw():
    one = Prompt(0, "solo", (("user", "a"),))
    turn1 = Prompt(1, "mt/81/turn1", (("user", "b"),), dataset="mt", row_id="81", turn=1)
    turn2 = Prompt(2, "mt/81/turn2", (("user", "c"),), dataset="mt", row_id="81", turn=2, follows=1)
    prompts, draws = expand([one, turn1, turn2], 3)
    assert [p.id for p in prompts] == ["solo#0", "solo#1", "solo#2", "mt/81/turn1#0", "mt/81/turn1#1",
                                       "mt/81/turn1#2", "mt/81/turn2#0", "mt/81/turn2#1", "mt/81/turn2#2"]
    assert [p.index for p in prompts] == list(range(9))  # unique, in prompt order: merges sort and key by it
    by_index = {p.index: (p, d) for p, d in zip(prompts, draws, strict=True)}
    for p, d in zip(prompts, draws, strict=True):
        if p.follows is not None:
            before, draw_before = by_index[p.follows]
            assert before.turn == 1 and draw_before.number == d.number and before.row_id == p.row_id
    assert [(d.prompt_index, d.prompt_id, d.number) for d in draws[6:]] == [(2, "mt/81/turn2", j) for j in range(3)]
    assert draws[0].entry() == {"prompt_index": 0, "prompt_id": "solo", "draw": 0, "seed": None}
    waves = turn_waves(prompts)
    assert waves == [[0, 1, 2, 3, 4, 5], [6, 7, 8]]  # every turn 2 draw after the turn 1 draws
