"""HTTP routes, thin, one module per route family: api (health, models, attention and its compact
transport), insight, trace, effects, corpus, pages (the page); common holds what they share (the router,
ERRORS, the 499 watch, ndjson_stream for every progress stream).

May import: app.schemas, app.service (through app.deps), app.errors and app.settings. Never `mha`.
"""
