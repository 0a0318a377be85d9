"""docs/isolation.md's table of achieved shares is the committed raw output of bench/bench_limiter.py
(bench/results/isolation/limiter.txt): a figure in the document is one someone measured and can measure again."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_share_table_is_the_committed_bench_output():
    raw = (ROOT / "bench" / "results" / "isolation" / "limiter.txt").read_text().splitlines()
    rows = [line.split() for line in raw[2:] if line.strip()]
    assert len(rows) >= 15, raw
    doc = (ROOT / "docs" / "isolation.md").read_text()
    for row in rows:
        assert "| " + " | ".join(row) + " |" in doc, f"docs/isolation.md lacks the bench row {row}"
