"""Torch internals that differ across the supported versions (accelpatch.core.torch_compat). On torch 2.11, Dynamo folded
``torch.compiler.is_exporting()`` to True in every traced region: counters inside ``torch.compile``d code then
believed they were being exported and counted nothing, and the pre-hook skipped closing an interrupted call's frame."""
import torch

from accelpatch.core.gate import SiteCounters
from accelpatch.core.torch_compat import is_exporting


def test_is_exporting_is_false_in_eager_and_under_torch_compile_and_true_under_export():
    seen = []

    def f(x):
        seen.append(is_exporting())
        return x + 1 if is_exporting() else x - 1

    class M(torch.nn.Module):
        def forward(self, x):
            return f(x)

    x = torch.zeros(1)
    assert f(x).item() == -1
    torch._dynamo.reset()
    assert torch.compile(f, backend="eager", fullgraph=True)(x).item() == -1
    assert torch.export.export(M(), (x,)).module()(x).item() == 1
    assert seen == [False, False, True]
    torch._dynamo.reset()


def test_counters_count_inside_torch_compile():
    counters = SiteCounters()
    counters.prepare([("fast", ""), ("reference", "why"), ("fallbacks", "why")])

    def f(x):
        counters.count_fast()
        counters.count_reference("why", fallback=True)
        return x + 1

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="eager", fullgraph=True)
    for _ in range(3):
        compiled(torch.zeros(2))
    totals = counters.totals()
    assert totals["fast"] == 3 and totals["reference"] == {"why": 3} and totals["fallbacks"] == {"why": 3}
    assert totals["uncounted"] is None
    torch._dynamo.reset()
