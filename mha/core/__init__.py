"""The attention core: ``MultiHeadAttention`` and what it is made of.

- ``attention``: scores -> masks -> soft-cap -> softmax, the keep masks and the SDPA path.
- ``multihead``: ``MultiHeadAttention`` (projections, grouped KV heads, rotary or relative positions).
- ``values``: what each head moves along its weights: its value vectors through out_proj, their products
  and norms.
- ``rope``: rotary embeddings and their scalings; ``relative``: T5's relative position bias.
- ``taps``: ``Taps``, what an analysis reads out of one attention or changes in it (weights' buffer,
  value products, head mask, a padded batch's real rows), one object from a network down to the core.
- ``norm``: RMSNorm; ``layers``: the blocks (attention + feed-forward, embeddings, norms).
- ``config``: ``TransformerConfig``, the one dataclass every block reads.

May import: torch, ``mha.errors`` and ``mha``'s private helpers (``_memory``, ``_threads``). Never a
network, a loader, analysis or web code.
"""
