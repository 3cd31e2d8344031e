"""Domain errors, defined once here and mapped once to HTTP by `install_handlers`."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)


class ServiceError(Exception):
    """Base of the errors a request can cause; `status` is the HTTP status it maps to."""

    status: int = 422

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class UnknownModelError(ServiceError):
    status = 404

    def __init__(self, name: str, known: Iterable[str]) -> None:
        names = ", ".join(sorted(known))
        # repr() so a name with quotes or newlines is shown, not interpreted.
        super().__init__(f"unknown model {name[:100]!r}; known models: {names}")
        self.name = name


class ModelUnavailableError(ServiceError):
    """A registered model that failed to load: the operator's checkpoint is broken, not the request."""

    status = 503

    def __init__(self, name: str, error: str) -> None:
        super().__init__(f"model {name!r} failed to load: {error}")


class InvalidInputError(ServiceError):
    """The request is well formed but its values do not fit the model (empty text, layer out of range)."""

    status = 422


def _service_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)  # registered for ServiceError only
    return JSONResponse({"detail": exc.detail}, status_code=exc.status)


def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)  # registered for RequestValidationError only
    return JSONResponse({"detail": describe_validation(exc, request.headers.get("content-type"))}, 422)


def describe_validation(exc: RequestValidationError, content_type: str | None) -> str:
    """One readable sentence per problem, e.g. "text: field required"; never echoes the input back."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        if error.get("type") == "json_invalid":
            where, message = (
                "body",
                f"malformed JSON at character {error['loc'][-1]}: {error.get('ctx', {}).get('error')}",
            )
        elif error.get("type") == "model_attributes_type" and "json" not in (content_type or ""):
            message = "send a JSON object with Content-Type: application/json"
        problems.append(f"{where}: {message}")
    return "; ".join(problems)


def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    detail = exc.detail
    if exc.status_code == 400 and detail == "There was an error parsing the body":
        # FastAPI answers 400 when the body is not valid UTF-8; to a client it is bad JSON like any other.
        return JSONResponse({"detail": "request body is not valid UTF-8 JSON"}, status_code=422)
    return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=exc.headers)


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
