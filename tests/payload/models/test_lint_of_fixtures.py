"""`dfo lint` on the drafters the suite builds (remote_payload/fixtures/): every format dfo loads, DFlash2 included,
lints clean against the fixture target (no error, no warning), and --deep finds the speculators drafter's
embedding copy equal to the target's bytes."""

from __future__ import annotations

import pytest

from orchestrator.lint.operation import Place, lint_checkpoint


@pytest.mark.parametrize("drafter", ["zlab-drafter", "dflash2-drafter", "speculators-drafter", "random-drafter",
                                     "trained-drafter/checkpoint.pt"])
def test_the_fixture_drafters_lint_clean(fixture_dir, drafter):
    report = lint_checkpoint(None, Place(None, str(fixture_dir / drafter)), Place(None, str(fixture_dir / "target")),
                             enable_thinking=False)
    loud = [f for f in report.findings if f.severity != "info"]
    assert report.ok and not loud, loud


def test_deep_compares_the_embedding_copy_with_the_targets_bytes(fixture_dir):
    report = lint_checkpoint(None, Place(None, str(fixture_dir / "speculators-drafter")),
                             Place(None, str(fixture_dir / "target")), deep=True)
    (digest,) = [f for f in report.findings if f.code == "embedding-digest"]
    assert "embed_tokens.weight: same bytes as model.embed_tokens.weight" in digest.message
