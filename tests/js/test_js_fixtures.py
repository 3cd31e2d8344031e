"""The HSA1 fixtures of the Node tests (tests/js/) are what app/compact.py makes today."""

from __future__ import annotations

from tests.js.hsa1_fixtures import FIXTURES, build, expected_json


def test_committed_fixtures_equal_what_the_encoder_makes() -> None:
    buffers, expected = build()
    stale = [name for name, buffer in buffers.items() if (FIXTURES / name).read_bytes() != buffer]
    if (FIXTURES / "expected.json").read_text(encoding="utf-8") != expected_json(expected):
        stale.append("expected.json")
    assert stale == [], f"stale fixtures {stale}: run PYTHONPATH=. .venv/bin/python tests/js/hsa1_fixtures.py"
