"""Domain errors, defined once here and mapped once to HTTP by `install_handlers`, with `mha`'s
`InputError` family (an input the model cannot run: the client's to fix, 422)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from mha.errors import EmptyInputError, InputError

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


class InputTooLongError(ServiceError):
    """More tokens than the service takes for this route and model: 413 with the limit."""

    status = 413


def _service_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)  # registered for ServiceError only
    return JSONResponse({"detail": exc.detail}, status_code=exc.status)


def _input_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InputError)  # registered for mha's InputError only
    detail = str(exc)
    if isinstance(exc, EmptyInputError):  # the one case that needs a hint to act on
        detail += "; give text the tokenizer turns into at least one token"
    return JSONResponse({"detail": detail}, status_code=422)


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
        elif str(error.get("type", "")).endswith("_type") and "input" in error:
            # Which JSON type came instead ("got a string"): says what is wrong without echoing the value.
            message = f"{message}, got {_json_type(error['input'])}"
        problems.append(f"{where}: {message}")
    return "; ".join(problems)


def _json_type(value: Any) -> str:
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string")):
        if isinstance(value, kind):
            return name
    return {list: "an array", dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    detail = exc.detail
    if exc.status_code == 400 and detail == "There was an error parsing the body":
        # FastAPI answers 400 for any error of json.loads other than a syntax error; to a client it is
        # a body we cannot read, like malformed JSON, so 422 saying which.
        return JSONResponse({"detail": _unreadable_body(exc.__cause__)}, status_code=422)
    return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=exc.headers)


def _unreadable_body(cause: BaseException | None) -> str:
    """Why json.loads refused a body that is not simply malformed (FastAPI keeps it as the cause)."""
    if isinstance(cause, RecursionError):
        return "request body is nested too deeply to read (a valid request nests objects 2 levels deep)"
    if isinstance(cause, UnicodeDecodeError):
        return "request body is not valid UTF-8 JSON"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        limit = sys.get_int_max_str_digits()
        return f"request body has a number too long to read: an integer may have at most {limit} digits"
    return "request body is not valid UTF-8 JSON"


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(InputError, _input_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
