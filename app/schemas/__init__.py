"""The request and response models: the OpenAPI contract of the HTTP API (docs/http-api.md), one module per
route family: attention (with the models list), insight, trace, effects, corpus; common holds the fields
and limits they share. Imports pydantic, app.settings and mha's constants only: never the service."""
