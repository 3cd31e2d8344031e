"""The HTTP layer against hostile or careless clients: Host header, strict types, bodies json cannot read,
content codings, what the schema promises, and a bug's 500."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.middleware import CSP
from app.schemas.common import MAX_TEXT_CHARS, NOT_BLANK
from app.settings import Settings
from tests.app.started import serving

TEXT = "The cat sat on the mat."


@pytest.fixture(scope="module")
def local(make_settings: Callable[..., Settings]) -> Iterator[TestClient]:
    """The default settings' host check: no configured names."""
    with serving(create_app(make_settings(allowed_hosts=[], default_model="random"))) as c:
        yield c


def assert_json_error(response, status: int, *needles: str) -> str:  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["content-security-policy"] == CSP
    assert response.headers["x-content-type-options"] == "nosniff"
    detail = response.json()["detail"]
    assert isinstance(detail, str)
    for needle in needles:
        assert needle in detail, detail
    return detail


# -- Host header: DNS rebinding ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    ["localhost", "localhost:8000", "LOCALHOST.", "127.0.0.1", "127.0.0.1:1234", "127.9.9.9", "[::1]:80"],
)
def test_local_names_are_served(local: TestClient, host: str) -> None:
    assert local.get("/api/health", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:8000",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "testserver",
        "10.0.0.1",
    ],
)
def test_a_foreign_host_is_refused_before_anything_runs(local: TestClient, host: str) -> None:
    # A rebinding page's requests carry its own name: refused, for a GET and for a POST (body never read).
    get = local.get("/api/health", headers={"Host": host})
    assert_json_error(get, 400, repr(host.partition(":")[0]), "HEADSCOPE_ALLOWED_HOSTS")
    post = local.post("/api/attention", json={"text": TEXT}, headers={"Host": host})
    assert post.status_code == 400
    assert local.get("/", headers={"Host": host}).status_code == 400  # the page too


def test_configured_hosts_and_wildcards(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(allowed_hosts=["Headscope.Example.ORG", "*.lab.example"], default_model="random")
    assert settings.allowed_hosts == ["headscope.example.org", "*.lab.example"]
    with serving(create_app(settings)) as c:
        for host, status in [
            ("headscope.example.org", 200),
            ("headscope.example.org:443", 200),
            ("gpu1.lab.example", 200),
            ("lab.example", 400),  # "*." is for subdomains only
            ("example.org", 400),
            ("localhost", 200),  # local names stay served
        ]:
            assert c.get("/api/health", headers={"Host": host}).status_code == status, host
    with serving(create_app(make_settings(allowed_hosts=["*"], default_model="random"))) as c:
        assert c.get("/api/health", headers={"Host": "anything.example"}).status_code == 200


# -- strict types -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "body", "needle"),
    [
        (
            "/api/attention",
            {"text": TEXT, "words": "yes"},
            "words: Input should be a valid boolean, got a string",
        ),
        (
            "/api/attention",
            {"text": TEXT, "words": 1},
            "words: Input should be a valid boolean, got an integer",
        ),
        (
            "/api/attention/head",
            {"text": TEXT, "layer": 2.5, "head": 0},  # 2.0 is an integer (JSON Schema): test_api.py
            "layer: Input should be a valid integer, got a number with a fractional part",
        ),
        (
            "/api/attention/head",
            {"text": TEXT, "layer": "2", "head": 0},
            "layer: Input should be a valid integer, got a string",
        ),
        (
            "/api/attention/head",
            {"text": TEXT, "layer": 0, "head": True},
            "head: Input should be a valid integer, got a boolean",
        ),
        ("/api/compare/head", {"a": {"text": "a"}, "b": {"text": "b"}, "layer": 0, "head": 1.5}, "head: "),
        ("/api/compare", {"a": {"text": "a"}, "b": {"text": "b"}, "words": "true"}, "words: "),
        (
            "/api/attention",
            {"text": TEXT, "model": 3},
            "model: Input should be a valid string, got an integer",
        ),
        ("/api/attention", {"text": TEXT, "text_pair": ["b"]}, "got an array"),
    ],
)
def test_no_coercion_where_the_schema_says_boolean_or_integer(
    local: TestClient, route: str, body: dict, needle: str
) -> None:
    detail = assert_json_error(local.post(route, json=body, headers={"Host": "localhost"}), 422, needle)
    assert "yes" not in detail and "2.5" not in detail  # the message names the type, never echoes the value


# -- bodies the json module cannot read, and content codings ------------------------------------------


def post_raw(client: TestClient, raw: bytes, **headers: str):  # type: ignore[no-untyped-def]
    return client.post(
        "/api/attention/head",
        content=raw,
        headers={"Host": "localhost", "Content-Type": "application/json", **headers},
    )


def test_too_deep_a_body_says_so(local: TestClient) -> None:
    raw = b'{"text": "a", "layer": 0, "head": 0, "words": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    assert_json_error(post_raw(local, raw), 422, "nested too deeply")


def test_too_long_a_number_says_so(local: TestClient) -> None:
    digits = sys.get_int_max_str_digits() + 1
    raw = b'{"text": "a", "layer": 1' + b"0" * (digits - 1) + b', "head": 0}'
    assert_json_error(post_raw(local, raw), 422, "number too long", f"{digits - 1} digits")


def test_invalid_utf8_still_says_utf8(local: TestClient) -> None:
    assert_json_error(post_raw(local, b'{"text": "caf\xe9", "layer": 0, "head": 0}'), 422, "UTF-8")


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "gzip, identity", "x-unknown"])
def test_a_compressed_body_is_415_naming_the_coding(local: TestClient, coding: str) -> None:
    import gzip

    raw = gzip.compress(b'{"text": "a", "layer": 0, "head": 0}')
    response = post_raw(local, raw, **{"Content-Encoding": coding})
    assert_json_error(response, 415, f"Content-Encoding {coding!r} is not accepted")
    assert response.headers["accept-encoding"] == "identity"


def test_identity_coding_is_served(local: TestClient) -> None:
    response = post_raw(local, b'{"text": "a", "layer": 0, "head": 0}', **{"Content-Encoding": "identity"})
    assert response.status_code == 200, response.text


# -- what the schema says is what the server takes -------------------------------------------------


def test_a_blank_pair_means_no_pair(local: TestClient) -> None:
    alone = local.post("/api/attention", json={"text": TEXT}, headers={"Host": "localhost"}).json()
    for pair in ("", "   ", "\n\t\u3000"):
        body = {"text": TEXT, "text_pair": pair}
        paired = local.post("/api/attention", json=body, headers={"Host": "localhost"})
        assert paired.status_code == 200, paired.text
        assert paired.json() == alone


def test_the_schema_states_the_non_blank_rule_as_python_applies_it(local: TestClient) -> None:
    jsonschema_rs = pytest.importorskip("jsonschema_rs")  # the validator schemathesis itself uses
    spec = local.get("/openapi.json", headers={"Host": "localhost"}).json()
    text = spec["components"]["schemas"]["InputText"]["properties"]["text"]
    # "" is the probe input's text (InputText.probe); else at least one non-space character.
    assert (text["pattern"], text["maxLength"]) == (f"^$|{NOT_BLANK}", MAX_TEXT_CHARS)
    validator = jsonschema_rs.validator_for({"type": "string", "pattern": text["pattern"]})
    assert validator.is_valid("")
    # Every character outside the surrogates: JSON Schema's reading of the pattern is Python's isspace().
    for code in (*range(0xD800), *range(0xE000, sys.maxunicode + 1)):
        if validator.is_valid(chr(code)) == chr(code).isspace():
            pytest.fail(f"U+{code:04X}: the schema and the server disagree on whether it is blank")
    for blank in (" ", "\u00a0\u2028", "\x1c\x85"):
        response = local.post("/api/attention", json={"text": blank}, headers={"Host": "localhost"})
        assert_json_error(response, 422, "text: text is blank")
    empty = local.post("/api/attention", json={"text": ""}, headers={"Host": "localhost"})
    assert_json_error(empty, 422, "text is empty: give a text, or a probe")


# -- a bug is a 500 in JSON, and the connection survives --------------------------------------------


def test_an_unexpected_error_is_a_json_500_with_the_security_headers(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(make_settings(default_model="random"))
    with serving(app) as c:

        def broken() -> None:
            raise KeyError((1, 1))

        monkeypatch.setattr(app.state.service.models, "health", broken)
        response = c.get("/api/health")
        assert_json_error(response, 500, "internal server error")
        assert "(1, 1)" not in response.text  # no internals to the client
        assert any("unhandled error" in r.getMessage() and r.exc_info for r in caplog.records)
        monkeypatch.undo()
        assert c.get("/api/health").status_code == 200
