"""headscope's web service: FastAPI over the `mha` library.

Data flows one way: routes/ (thin) -> service/ (the one package that runs `mha`: models, forwards,
caching, encoding) -> mha; schemas/, settings, errors, registry, cache and encoders sit beneath both.
Outside service/ only three modules touch `mha`, each for one thing: errors (maps mha's InputError),
compact (mha.devices' host copy) and corpus_cli (runs mha.corpus).
"""
