"""Text to ids: ``tokenize`` (text, pair or chat template -> ids, tokens, segments, special marks)
and ``slow_tokenize`` (the bounded path for inputs too long for one fast call).

May import: tokenizers / transformers' tokenizers and ``mha.errors``. Nothing else of ``mha``.
"""
