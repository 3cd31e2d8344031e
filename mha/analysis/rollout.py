"""Attention rollout and attention flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in
Transformers"): how each output token at the top draws on each input token at the bottom.

Rollout, ``rollout`` / ``rollout_per_layer``. Per layer l the heads are reduced (mean by default, or max
/ min) to A_l, then Ã_l = (1 - r) A_l + r I with r = ``residual`` (0.5: the residual stream counts as much
as attention), rows renormalised to sum 1 (a row left with no weight, possible only with r = 0 and "min",
stays 0). R = Ã_L ··· Ã_1: row i says how output token i at the top draws on input token j at the bottom.
The per-layer rollout is R_l = Ã_l ··· Ã_1 for l = 1..L, so R_L = R. Computed in float64.

Attention flow, ``attention_flow``: the layered graph has nodes (l, t) for l = 0..L and t = 0..n-1 and
an edge (l, i) -> (l-1, j) of capacity Ã_l[i, j] (the same matrices as rollout). Entry [i, j] is the
max-flow value from (L, i) to (0, j), each pair solved as its own problem with networkx (shortest
augmenting path), so an entry lies in [0, 1] but rows do not sum to 1 (the raw form). ``normalize=True``
gives the paper's published form (``compute_flows`` in its code): each row divided by its sum, a
distribution over input tokens like a rollout row. Zero capacities (a causal row never attends forward;
a weight can round to 0) are edges that carry nothing. Cost: n² max-flow problems (one per requested
query row times n) over a graph of (L+1)·n nodes and L·n² edges, about L·n⁴ work in pure Python;
measured for L = 6 on a shared, loaded core at ~1 s for n = 12 and ~3 s for n = 16
(benchmarks/analysis.py), hence FLOW_MAX_TOKENS (14): longer inputs raise FlowTooLongError (limit, n).
Capacities are scaled to integers by ``FLOW_CAPACITY_SCALE`` (networkx is exact on integers), which moves
a value by less than L·n²/(2·FLOW_CAPACITY_SCALE) (< 1e-5 at the allowed sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from mha.analysis._base import check_attention
from mha.errors import FlowTooLongError, QueriesOutOfRangeError

__all__ = [
    "FLOW_CAPACITY_SCALE",
    "FLOW_MAX_TOKENS",
    "HeadReduce",
    "attention_flow",
    "normalize_flow",
    "rollout",
    "rollout_per_layer",
]

FLOW_MAX_TOKENS = 14  # ~2 s at 6 layers on a loaded shared core (benchmarks/analysis.py); cost ~ L·n⁴
FLOW_CAPACITY_SCALE = 10**9

HeadReduce = Literal["mean", "max", "min"]


def _layer_matrices(attentions: Tensor, *, residual: float, head_reduce: HeadReduce) -> Tensor:
    """Ã_l for every layer, float64 [L, n, n]: reduced heads, residual mixed in, rows renormalised."""
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must lie in [0, 1], got {residual}")
    # Heads are reduced in the input dtype first: a float64 copy of the whole map costs more than
    # all the matrix products.
    if head_reduce == "mean":
        reduced = attentions.mean(dim=1).double()
    elif head_reduce == "max":
        reduced = attentions.amax(dim=1).double()
    elif head_reduce == "min":
        reduced = attentions.amin(dim=1).double()
    else:
        raise ValueError(f"head_reduce must be 'mean', 'max' or 'min', got {head_reduce!r}")
    n = reduced.shape[-1]
    mixed = (1 - residual) * reduced + residual * torch.eye(n, dtype=torch.float64)  # [L, n, n]
    totals = mixed.sum(-1, keepdim=True)
    return mixed / torch.where(totals > 0, totals, torch.ones_like(totals))


def rollout_per_layer(
    attentions: Tensor, *, residual: float = 0.5, head_reduce: HeadReduce = "mean"
) -> Tensor:
    """Cumulative rollout after each layer, [L, n, n]: entry l is Ã_{l+1} ··· Ã_1 (module docstring)."""
    check_attention(attentions)
    layer_maps = _layer_matrices(attentions, residual=residual, head_reduce=head_reduce)
    cumulative = torch.empty_like(layer_maps)
    cumulative[0] = layer_maps[0]
    for layer in range(1, layer_maps.shape[0]):  # a product has to run layer by layer
        cumulative[layer] = layer_maps[layer] @ cumulative[layer - 1]
    return cumulative.to(attentions.dtype)


def rollout(attentions: Tensor, *, residual: float = 0.5, head_reduce: HeadReduce = "mean") -> Tensor:
    """Attention rollout R = Ã_L ··· Ã_1, [n, n] (Abnar & Zuidema 2020; module docstring)."""
    return rollout_per_layer(attentions, residual=residual, head_reduce=head_reduce)[-1]


def attention_flow(
    attentions: Tensor,
    *,
    max_tokens: int = FLOW_MAX_TOKENS,
    residual: float = 0.5,
    head_reduce: HeadReduce = "mean",
    queries: Sequence[int] | None = None,
    normalize: bool = False,
) -> Tensor:
    """Attention flow (Abnar & Zuidema 2020): max-flow from output token i to input token j.

    Returns [q, n] for the rows ``queries`` (all n rows by default, giving [n, n]), in one of two forms:

    - ``normalize=False`` (raw): entry [i, j] is the max-flow value from (L, i) to (0, j) in the layered
      graph of the module docstring, each pair its own problem. It lies in [0, 1], but a row does not
      sum to 1: the same capacity near the top carries the flow to several inputs j.
    - ``normalize=True``: each raw row divided by its sum, as the paper's ``compute_flows`` does, so row i
      is a distribution over the input tokens, comparable with rollout's rows. A row with no flow at all
      (possible only with ``residual=0``) stays 0.

    Cost is q·n max-flow problems over (L+1)·n nodes and L·n² edges (module docstring); inputs longer
    than ``max_tokens`` are refused. Asking for few ``queries`` (say the [CLS] row) makes a larger
    ``max_tokens`` affordable.
    """
    layers, _, n = check_attention(attentions)
    if n > max_tokens:
        raise FlowTooLongError(max_tokens, n)
    rows = list(range(n)) if queries is None else [int(q) for q in queries]
    outside = [q for q in rows if not 0 <= q < n]
    if outside:
        raise QueriesOutOfRangeError(outside, n)
    layer_maps = _layer_matrices(attentions, residual=residual, head_reduce=head_reduce)
    if layers == 1:  # one edge from (1, i) to (0, j): the flow is its capacity
        flow = layer_maps[0][rows]
    else:
        flow = _max_flows(layer_maps, rows)
    return (normalize_flow(flow) if normalize else flow).to(attentions.dtype)


def normalize_flow(flow: Tensor) -> Tensor:
    """Raw attention flow [..., q, n] with each row divided by its sum (the published form, as
    `attention_flow(normalize=True)`); a row with no flow at all stays 0."""
    totals = flow.sum(-1, keepdim=True)
    return flow / torch.where(totals > 0, totals, torch.ones_like(totals))


def _max_flows(layer_maps: Tensor, rows: list[int]) -> Tensor:
    """Raw flow values [q, n] in float64 for L >= 2 layer matrices Ã_l [L, n, n]."""
    # Here, not at the top: networkx costs ~0.3-0.45 s of `import mha`, and only flow needs it.
    import networkx as nx
    from networkx.algorithms.flow import build_residual_network, shortest_augmenting_path

    layers, n, _ = layer_maps.shape
    capacity = (
        (layer_maps * FLOW_CAPACITY_SCALE).round().long().tolist()
    )  # [l - 1][i][j]: (l, i) -> (l - 1, j)

    # One graph serves every (i, j) problem: "source" stands for (L, i) with edges to layer L-1 of
    # capacity Ã_L[i, :], and "sink" for (0, j) with edges from layer 1 of capacity Ã_1[:, j]. The
    # other top and bottom nodes are unreachable or dead ends, so leaving them out changes no flow
    # value. Between problems only those 2n capacities change; they are set in the residual network
    # (networkx's documented R[u][v]["capacity"]), which every solve resets and reuses.
    graph = nx.DiGraph()
    # The 2n changing edges are built at the largest capacity an edge can have: networkx leaves a
    # zero-capacity edge out of the residual network (a causal row never attends forward; a weight can
    # round to 0), so one built at 0 could not be given a capacity later. Its stand-in for infinity,
    # 3 x the total capacity, stays above any single path's flow (at most FLOW_CAPACITY_SCALE).
    for k in range(n):
        graph.add_edge("source", (layers - 1, k), capacity=FLOW_CAPACITY_SCALE)
        graph.add_edge((1, k), "sink", capacity=FLOW_CAPACITY_SCALE)
    for layer in range(2, layers):
        for i in range(n):
            for j in range(n):
                if capacity[layer - 1][i][j]:  # a zero edge carries nothing and never changes
                    graph.add_edge((layer, i), (layer - 1, j), capacity=capacity[layer - 1][i][j])
    residual_network = build_residual_network(graph, "capacity")
    out_edges = residual_network.succ["source"]
    in_edges = residual_network.pred["sink"]
    flow = torch.zeros(len(rows), n, dtype=torch.float64)
    for out_row, query in enumerate(rows):
        for k in range(n):
            out_edges[(layers - 1, k)]["capacity"] = capacity[layers - 1][query][k]
        for sink_token in range(n):
            for k in range(n):
                in_edges[(1, k)]["capacity"] = capacity[0][k][sink_token]
            value = nx.maximum_flow_value(
                graph, "source", "sink", flow_func=shortest_augmenting_path, residual=residual_network
            )
            flow[out_row, sink_token] = value / FLOW_CAPACITY_SCALE
    return flow
