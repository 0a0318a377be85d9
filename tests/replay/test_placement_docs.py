"""docs/placement.md holds exactly the tables bench/placement_tables.py makes from the committed raw results
(bench/results/): a figure in the document is a figure someone can regenerate."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _tables_module():
    spec = importlib.util.spec_from_file_location("placement_tables", REPO / "bench" / "placement_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_documented_tables_are_the_ones_the_raw_results_give():
    tables = _tables_module()
    documented = tables.blocks((REPO / "docs" / "placement.md").read_text())
    expected = tables.tables(REPO / "bench" / "results")
    assert set(documented) == set(expected)
    for name, table in expected.items():
        assert documented[name] == table, f"table {name!r} is stale: run bench/placement_tables.py --write"


def test_every_committed_result_file_is_in_a_table():
    tables = _tables_module()
    expected = tables.tables(REPO / "bench" / "results")
    for folder, name in (("placement", "suite"), ("departures", "departures")):
        for path in (REPO / "bench" / "results" / folder).glob("*.json"):
            assert f"| {path.stem} |" in expected[name], path


def test_the_dra_table_is_the_one_the_raw_results_give():
    """docs/dra.md's comparison of placement under DRA is `bench/dra_suite.py --table` over bench/results/dra."""
    sys.path.insert(0, str(REPO / "bench"))   # dra_suite imports placement_suite, its neighbour
    try:
        spec = importlib.util.spec_from_file_location("dra_suite", REPO / "bench" / "dra_suite.py")
        assert spec is not None and spec.loader is not None
        suite = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(suite)
    finally:
        sys.path.remove(str(REPO / "bench"))
    expected = suite.table(REPO / "bench" / "results" / "dra", list(suite.GIVEN))
    assert expected.count("\n") >= 2, expected   # a header, its rule and at least one trace
    assert expected in (REPO / "docs" / "dra.md").read_text(), "stale: paste `bench/dra_suite.py --table` into it"


def test_the_consolidation_table_is_the_one_the_raw_results_give():
    """docs/consolidation.md's replay table is `bench/consolidation_replay.py --table` over its committed rows."""
    sys.path.insert(0, str(REPO / "bench"))   # consolidation_replay imports placement_suite, its neighbour
    try:
        path = REPO / "bench" / "consolidation_replay.py"
        spec = importlib.util.spec_from_file_location("consolidation_replay", path)
        assert spec is not None and spec.loader is not None
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(REPO / "bench"))
    rows = bench.load(REPO / "bench" / "results" / "consolidation" / "default.json")
    assert {(r["ratio"], r["share_per_hour"]) for r in rows} >= {(2.0, 0.0), (2.0, 0.05)}
    table = bench.table(rows)
    text = (REPO / "docs" / "consolidation.md").read_text()
    assert f"<!-- table:consolidation -->\n{table}\n<!-- /table:consolidation -->" in text, \
        "stale: paste `bench/consolidation_replay.py --table` into docs/consolidation.md"
