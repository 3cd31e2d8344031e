"""Long inputs: attention traced block by block, never holding n x n.

- ``blocked``: ``Trace``, the blocked path, the pooled overview, windows and rows.
- ``fused``: the fused kernel path (log-sum-exp overview).
- ``memory``: the memory model of a trace (scratch per forward, bytes held).

May import: ``mha.networks``, ``mha.core``, ``mha.text``, ``mha.errors`` and ``mha``'s private helpers.
Never a loader, analysis or web code.
"""
