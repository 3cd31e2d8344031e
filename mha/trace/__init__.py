"""Long inputs: attention traced block by block, never holding n x n.

- ``windows``: ``Trace``, what a trace keeps, and the windows, rows and overviews recomputed from it.
- ``blocked``: the trace's forward (``trace_forward``): each layer fused or in row blocks by hand, what
  it keeps (``LayerTrace``) and the bytes it declares.
- ``overview``: weights pooled into blocks (``Pooled``, ``edges``), "max" or "mean".
- ``fused``: the fused kernel path (log-sum-exp overview).
- ``memory``: the memory model of a trace (scratch per forward, bytes held).

May import: ``mha.networks``, ``mha.core``, ``mha.text``, ``mha.errors`` and ``mha``'s private helpers.
Never a loader, analysis or web code.
"""

from mha.trace.blocked import bytes_per_token, expected_nbytes, peak_nbytes
from mha.trace.overview import OVERVIEW_SIZE, Pool, Pooled, edges
from mha.trace.windows import Trace

__all__ = [
    "OVERVIEW_SIZE",
    "Pool",
    "Pooled",
    "Trace",
    "bytes_per_token",
    "edges",
    "expected_nbytes",
    "peak_nbytes",
]
