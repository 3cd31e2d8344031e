"""Text to ids: ``tokenize`` (text, pair or chat template -> ids, tokens, segments, special marks),
``slow_tokenize`` (the bounded path for inputs too long for one fast call) and ``chat`` (chat templates,
untrusted code, rendered in a worker process under a time, memory and output bound).

May import: tokenizers / transformers' tokenizers and ``mha.errors``. Nothing else of ``mha``.
"""
