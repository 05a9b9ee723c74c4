"""The benchmark's modules read like the package's: no import cycle among them (size is a guideline, as there).

``bench/`` is parsed with ``ast`` by the same graph builder as the
package's layering test (every import counts, deferred ones too), so a
report section that reaches back into the runner that imports it fails
here, not in a reader's head.
"""

from __future__ import annotations

from pathlib import Path

from test_layering import import_cycles, module_graph

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_bench_modules_import_each_other_without_a_cycle() -> None:
    graph = module_graph(BENCH)
    assert "bench.run" in graph and "bench.network" in graph  # the graph is the bench's, not an empty one
    assert import_cycles(graph) == []


def test_the_checker_sees_a_cycle_through_a_deferred_import(tmp_path: Path) -> None:
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "__init__.py").write_text("")
    (bench / "run.py").write_text("from .network import run_scenarios\n")
    (bench / "network.py").write_text("def f():\n    from .run import Bench\n")
    assert import_cycles(module_graph(bench)) == [["bench.network", "bench.run"]]
