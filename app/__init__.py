"""headscope's web service: FastAPI over the `mha` library.

Data flows one way: routes/ (thin) -> service/ (the one package that runs `mha`: models, forwards,
caching, encoding) -> mha; schemas/, settings, errors, registry, cache and encoders sit beneath both.
Outside service/ only these touch `mha`, each for one thing: errors (maps mha's InputError), compact
(mha.devices' host copy), corpus_cli (runs mha.corpus) and snapshot/ (an attend result in, one offline
file out, built with the service's own answer builders; or one head of it as a plotly figure).
"""
