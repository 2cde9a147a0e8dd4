"""The generated blocks of the docs (orchestrator/demo/docs_outputs.py): every marker names a block the
generator produces, and the rewrite and the cutting do what they say. Nothing runs here; the generator itself
runs the demo (scripts/docs-outputs.sh)."""

from __future__ import annotations

from orchestrator.demo import docs_outputs as gen


def test_every_marked_block_is_one_the_generator_produces():
    used = {name: page.name for page in gen.pages() for name in gen.marker_names(page.read_text(encoding="utf-8"))}
    assert sorted(set(used) - set(gen.PRODUCED)) == [], "markers nothing regenerates"
    assert sorted(set(gen.PRODUCED) - set(used)) == [], "blocks the generator makes that no page shows"


def test_rewrite_replaces_only_the_named_blocks():
    text = ("intro\n<!-- docs-output: a -->\n```\nold a\n```\n<!-- /docs-output -->\nmiddle\n"
            "<!-- docs-output: b -->\n```text\nold b\n```\n<!-- /docs-output -->\n```\nplain block\n```\n")
    new, missing = gen.rewrite(text, {"a": "new a\nline 2\n"})
    assert new == ("intro\n<!-- docs-output: a -->\n```\nnew a\nline 2\n```\n<!-- /docs-output -->\nmiddle\n"
                   "<!-- docs-output: b -->\n```text\nold b\n```\n<!-- /docs-output -->\n```\nplain block\n```\n")
    assert missing == ["b"]
    assert gen.marker_names(text) == ["a", "b"]


DEMO_OUT = """
demo ▸ start sandbox hosts kpro6 and ct129 (real sshd) in /tmp/s
  isolated: True; inventory /tmp/s/inventory.yaml
  kpro6 → ct129 directly: unreachable, as on the real hosts
demo ▸ deploy the payload to both hosts
ct129: pushing uv
demo ▸ dfo eval --host ct129 --dataset builtin
▸ check inputs on the hosts
▸ relay drafter 'ours': kpro6:/a → ct129:/b (optimizer state stripped on the source)
  447,882 B sent, 0 B already there, 3.5s
▸ pull results (sha256-verified)
  ct129: 2 file(s), 177,121 B pulled
result: ours τ 3.19
demo ▸ the same eval at T=1: --temperature 1
▸ relay drafter 'ours': kpro6:/a → ct129:/b (optimizer state stripped on the source)
  590 B sent, 447,292 B already there, 4.2s
demo finished in 170s; sandbox hosts stopped
run 20261204-125400-ct129-56e3
| table |
run folder: runs/20261204-125400-ct129-56e3  (report.md)
τ at T=0 and at T=1 (3 seeded draws per prompt):
  ours      3.19  1.33

cards (figures measured with --enable-thinking both; card files in runs/r/cards):
  card demo-thinking-off: τ 4.12 (…): reproduced, Δ +0.00
  card demo-thinking-unknown: τ 4.12 (…): above, Δ +2.82
"""


def test_the_demo_blocks_are_cut_from_the_demo_output():
    blocks = gen.demo_blocks(DEMO_OUT)
    assert blocks["demo-steps"].splitlines() == [
        "demo ▸ start sandbox hosts kpro6 and ct129 (real sshd) in /tmp/s",
        "  kpro6 → ct129 directly: unreachable, as on the real hosts",
        "demo ▸ deploy the payload to both hosts",
        "demo ▸ dfo eval --host ct129 --dataset builtin",
        "▸ relay drafter 'ours': kpro6:/a → ct129:/b (optimizer state stripped on the source)",
        "  447,882 B sent, 0 B already there, 3.5s",
        "▸ pull results (sha256-verified)",
        "  ct129: 2 file(s), 177,121 B pulled",
    ]
    assert blocks["demo-table"] == ("run 20261204-125400-ct129-56e3\n| table |\n"
                                    "run folder: runs/20261204-125400-ct129-56e3  (report.md)")
    assert blocks["demo-temperature"] == "τ at T=0 and at T=1 (3 seeded draws per prompt):\n  ours      3.19  1.33"
    assert blocks["demo-cards"].splitlines() == [
        "cards (figures measured with --enable-thinking both; card files in runs/r/cards):",
        "  card demo-thinking-off: τ 4.12 (…): reproduced, Δ +0.00",
        "  card demo-thinking-unknown: τ 4.12 (…): above, Δ +2.82"]


def test_report_benchmarks_is_the_section_body():
    report = "# Run\n\n## Benchmarks\n\nτ macro table\n| a |\n\n## Drafters\nrest\n"
    assert gen.report_benchmarks(report) == "τ macro table\n| a |"
