"""Every endpoint and every error of the HTTP API, against the embedded all-MiniLM-L6-v2."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import tolerances
import torch
from fastapi.testclient import TestClient
from tolerances import FORWARD, quant8

from app.main import create_app
from app.middleware import CSP
from tests.app.started import serving

TEXT = "The cat sat on the mat because it was tired."
PAIR = "It fell asleep soon after."


def decode_hsa1(buffer: bytes) -> tuple[dict, np.ndarray]:
    """An independent reading of docs/design.md's table (not app.compact.decode)."""
    assert buffer[:4] == b"HSA1"
    h = struct.unpack("<I", buffer[4:8])[0]
    header = json.loads(buffer[8 : 8 + h])
    start = 8 + h
    start += (4 - start % 4) % 4
    assert set(buffer[8 + h : start]) <= {0}, "padding must be zero bytes"
    L, H, n = header["layers"], header["heads"], header["n"]
    scales = np.frombuffer(buffer[start : start + 4 * L * H * n], dtype="<f4").reshape(L, H, n)
    q = np.frombuffer(buffer[start + 4 * L * H * n :], dtype=np.uint8)
    assert q.size == L * H * n * n, "no trailing or missing bytes"
    return header, q.reshape(L, H, n, n).astype(np.float64) / 255 * scales[..., None]


# -- health, models, security headers ---------------------------------------------------------------


def test_health_reports_the_loaded_default(client: TestClient) -> None:
    r = client.get("/api/health")
    assert r.status_code == 200
    body = {"status": "ok", "model": "all-MiniLM-L6-v2", "device": "cpu", "loading": [], "checking": []}
    assert r.json() == body


def test_models_lists_default_loaded_and_random_lazy(client: TestClient) -> None:
    body = client.get("/api/models").json()
    assert body["default"] == "all-MiniLM-L6-v2"
    by_name = {m["name"]: m for m in body["models"]}
    assert by_name["all-MiniLM-L6-v2"] == {
        "name": "all-MiniLM-L6-v2",
        "family": "bert",
        "layers": 6,
        "heads": 12,
        "kv_heads": 12,
        "chat_template": False,
        "byte_level": False,
        "max_tokens": 512,
        "architecture": "encoder",
        "decoder_layers": None,  # an encoder-decoder's, where its decoder's shape differs
        "decoder_heads": None,
        "trace_max_tokens": 512,  # the model's own limit: the default 2 GiB holds far more
        "causal": False,
        "pretrained": True,
        "loaded": True,
        "error": None,
        # what its files' headers say, from the startup check (issue 34)
        "source": "bundled",
        "header_family": "bert",
        "parameters": 22_713_728,
        "quantization": "F32",
        "size_bytes": 90_868_376,
        "state": "loaded",
        "memory_bytes": 90_261_504,  # its 22,565,376 weights in float32
    }
    random = by_name["random"]  # no check to run: "available" until its first request loads it
    assert random["state"] == ("loaded" if random["loaded"] else "available")


def test_security_headers_on_api_and_errors(client: TestClient) -> None:
    for response in (client.get("/api/health"), client.post("/api/attention", json={})):
        assert response.headers["content-security-policy"] == CSP
        # The policy itself, read from the header (not from the constant it was compared with): scripts,
        # plugins, framing and <base> only from us or nowhere; no inline or eval'd script.
        policy = dict(
            (directive.split()[0], directive.split()[1:])
            for directive in response.headers["content-security-policy"].split(";")
        )
        assert policy["default-src"] == policy["script-src"] == ["'self'"]
        assert policy["object-src"] == policy["base-uri"] == policy["frame-ancestors"] == ["'none'"]
        assert all("unsafe" not in source for source in policy["default-src"] + policy["script-src"])
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "no-referrer"
        assert response.headers["x-frame-options"] == "DENY"


# -- /api/attention --------------------------------------------------------------------------------


@pytest.mark.parametrize("pair", [None, PAIR])
def test_json_attention_equals_mha(client: TestClient, minilm, pair: str | None) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/api/attention", json={"text": TEXT, "text_pair": pair})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    expected = minilm.attend(TEXT, pair)
    assert body["model"] == "all-MiniLM-L6-v2"
    assert body["tokens"] == expected.tokens
    assert body["segments"] == expected.segments
    assert body["special"] == expected.special
    assert (body["layers"], body["heads"], body["n"]) == (6, 12, len(expected.tokens))
    assert body["truncated"] is False and body["causal"] is False
    got = torch.tensor(body["attention"], dtype=torch.float64)
    # The service's forward and mha's are two float32 passes, and the JSON is rounded to 6 decimals.
    torch.testing.assert_close(got, expected.attentions.double(), atol=tolerances.FORWARD_JSON, rtol=0)
    if pair is not None:
        assert 1 in body["segments"]
    # "to 6 decimals": no value carries more digits than that
    raw = r.text[r.text.index('"attention"') :]
    decimals = [len(tok.split(".")[1]) for tok in raw.replace("]", ",").split(",") if "." in tok]
    assert max(decimals) <= 6


def test_long_text_is_truncated_to_the_model_maximum(client: TestClient) -> None:
    long_text = " ".join(["word"] * 700)  # ~700 tokens > 512
    r = client.post("/api/attention/compact", json={"text": long_text})
    assert r.headers["content-encoding"] == "gzip"  # sent gzipped; httpx has decoded it
    header, _ = decode_hsa1(r.content)
    assert header["truncated"] is True
    assert header["n"] == 512
    short = client.post("/api/attention", json={"text": "word"}).json()
    assert short["truncated"] is False


def test_service_max_tokens_caps_below_the_model(make_settings) -> None:  # type: ignore[no-untyped-def]
    with serving(create_app(make_settings(max_tokens=16))) as c:
        body = c.post("/api/attention", json={"text": " ".join(["word"] * 40)}).json()
        assert body["n"] == 16 and body["truncated"] is True


# -- /api/attention/compact -------------------------------------------------------------------------


def test_compact_decodes_within_its_stated_error(client: TestClient, minilm) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/api/attention/compact", json={"text": TEXT, "text_pair": PAIR})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/vnd.headscope.attention"
    assert r.headers["content-encoding"] == "gzip"  # TestClient sends Accept-Encoding: gzip, deflate
    assert "accept-encoding" in r.headers["vary"].lower()
    header, values = decode_hsa1(r.content)  # httpx already undid the gzip
    expected = minilm.attend(TEXT, PAIR)
    assert header["tokens"] == expected.tokens
    assert header["quantization"]["scheme"] == "row-max-uint8"
    bound = header["quantization"]["max_abs_error"]
    assert bound == pytest.approx(1 / 510)
    ref = expected.attentions.double().numpy()
    err = np.abs(values - ref)
    # per row: within scale/510 of the service's own forward, which is within FORWARD of mha's (two float32
    # passes), and so within the stated bound
    scales = ref.max(axis=-1, keepdims=True)
    assert (err <= scales / 510 + tolerances.FORWARD).all()
    assert err.max() <= bound + tolerances.FORWARD
    # the row maximum is carried exactly: only the two forward passes differ
    np.testing.assert_allclose(values.max(axis=-1), ref.max(axis=-1), atol=tolerances.FORWARD, rtol=0)


def test_compact_is_small_on_the_wire(client: TestClient) -> None:
    text = " ".join(f"Sentence number {i} says something different about cats and dogs." for i in range(10))
    sizes = {}
    for scheme in ("row-max-uint8", "abs-uint8"):
        r = client.post(f"/api/attention/compact?scheme={scheme}", json={"text": text})
        header, values = decode_hsa1(r.content)
        assert header["quantization"]["scheme"] == scheme
        n = header["n"]
        sizes[scheme] = int(r.headers["content-length"]) / (6 * 12 * n * n)  # gzipped bytes per value
    assert n > 100
    # raw would be 1 + 4/n bytes per value; bertviz's JSON about 45
    assert sizes["row-max-uint8"] < 0.6, sizes
    assert sizes["abs-uint8"] < 0.3, sizes


def test_compact_abs_scheme_is_within_the_same_bound(client: TestClient, minilm) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/api/attention/compact?scheme=abs-uint8", json={"text": TEXT})
    header, values = decode_hsa1(r.content)
    err = np.abs(values - minilm.attend(TEXT).attentions.double().numpy())
    # the stated bound holds against the service's own forward; mha's is a second float32 pass
    assert err.max() <= header["quantization"]["max_abs_error"] + tolerances.FORWARD
    assert client.post("/api/attention/compact?scheme=zip", json={"text": TEXT}).status_code == 422


def test_compact_without_gzip_is_the_raw_buffer(client: TestClient) -> None:
    r = client.post("/api/attention/compact", json={"text": TEXT}, headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in r.headers
    header, _ = decode_hsa1(r.content)
    n = header["n"]
    assert int(r.headers["content-length"]) >= 6 * 12 * n * (n + 4)
    no_gzip = {"Accept-Encoding": "gzip;q=0"}
    refused = client.post("/api/attention/compact", json={"text": TEXT}, headers=no_gzip)
    assert "content-encoding" not in refused.headers


# -- /api/attention/head ----------------------------------------------------------------------------


def test_head_is_full_precision(client: TestClient, minilm) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/api/attention/head", json={"text": TEXT, "layer": 5, "head": 11})
    assert r.status_code == 200
    body = r.json()
    assert (body["layer"], body["head"], body["model"]) == (5, 11, "all-MiniLM-L6-v2")
    expected = minilm.attend(TEXT).attentions[5, 11]
    values = [value for row in body["attention"] for value in row]
    # full precision: every value is a float32 as such (not rounded to 6 decimals), and most carry more digits
    assert all(float(np.float32(v)) == v for v in values)
    assert sum(v != round(v, 6) for v in values) > len(values) // 2
    got = torch.tensor(body["attention"], dtype=torch.float32)
    # the service's forward and mha's are two float32 passes
    torch.testing.assert_close(got, expected, atol=tolerances.FORWARD, rtol=0)


@pytest.mark.parametrize(("layer", "head", "word"), [(6, 0, "layer 6"), (0, 12, "head 12")])
def test_head_out_of_range_is_422(client: TestClient, layer: int, head: int, word: str) -> None:
    r = client.post("/api/attention/head", json={"text": TEXT, "layer": layer, "head": head})
    assert r.status_code == 422
    assert word in r.json()["detail"]
    assert "0.." in r.json()["detail"]


def test_a_whole_number_written_as_a_float_is_an_integer(client: TestClient) -> None:
    # JSON Schema counts 5.0 as an integer, so the server takes it as 5 (and the answer is the same).
    exact = client.post("/api/attention/head", json={"text": TEXT, "layer": 5, "head": 11})
    written = client.post("/api/attention/head", json={"text": TEXT, "layer": 5.0, "head": 11.0})
    assert written.status_code == 200 and written.content == exact.content
    for route, body, as_floats in (
        ("/api/trace/overview", {"size": 4}, {"size": 4.0}),
        (
            "/api/trace/window",
            {"layer": 0, "head": 1, "rows": [0, 3], "max_cells": 2},
            {"layer": 0.0, "head": 1.0, "rows": [0.0, 3.0], "max_cells": 2.0},
        ),
    ):
        exact = client.post(route, json={"text": TEXT, **body})
        written = client.post(route, json={"text": TEXT, **as_floats})
        assert exact.status_code == 200 and written.content == exact.content, written.text
    refused = client.post("/api/attention/head", json={"text": TEXT, "layer": 5.5, "head": 0})
    assert refused.status_code == 422
    assert (
        refused.json()["detail"]
        == "layer: Input should be a valid integer, got a number with a fractional part"
    )


def test_the_schema_states_every_bound_in_json_schema_words(client: TestClient) -> None:
    # pydantic writes a bound that follows a validator as "ge" or "le", which JSON Schema does not know: a
    # schema-driven client would then send -1 for a layer, and the server refuse it.
    def keys(node: object) -> set[str]:
        if isinstance(node, dict):
            return set(node) | {key for value in node.values() for key in keys(value)}
        return {key for value in node for key in keys(value)} if isinstance(node, list) else set()

    schema = client.get("/openapi.json").json()
    assert not keys(schema) & {"ge", "le", "gt", "lt", "multiple_of", "min_length", "max_length"}
    layer = schema["components"]["schemas"]["HeadRequest"]["properties"]["layer"]
    assert (layer["type"], layer["minimum"]) == ("integer", 0)


@pytest.mark.parametrize("limit", [None, 5])
def test_openapi_states_the_new_token_bound_the_service_enforces(limit: int | None) -> None:
    """Issue 48: the schema said max_new_tokens <= 256 while the service took 32 (HEADSCOPE_MAX_NEW_TOKENS):
    every body's bound is the service's, and one past it is refused as the document says."""
    from app.settings import Settings
    from tests.app.conftest import make_settings

    settings = make_settings() if limit is None else make_settings(max_new_tokens=limit)
    enforced = Settings.model_fields["max_new_tokens"].default if limit is None else limit
    with TestClient(create_app(settings)) as bounded:
        schemas = bounded.get("/openapi.json").json()["components"]["schemas"]
        bounds = {
            name: [
                b.get("maximum")
                for b in schema["properties"]["max_new_tokens"]["anyOf"]
                if b["type"] == "integer"
            ]
            for name, schema in schemas.items()
            if "max_new_tokens" in schema.get("properties", {})
        }
        assert {"AttentionRequest", "HeadEffectsRequest"} <= set(bounds)
        assert all(found == [enforced] for found in bounds.values()), bounds
        over = bounded.post(
            "/api/attention", json={"text": TEXT, "model": "random", "max_new_tokens": enforced + 1}
        )
        assert over.status_code == 422 and "over this service's limit" in over.json()["detail"]


# -- the random model -------------------------------------------------------------------------------


def test_random_model_loads_on_first_use(client: TestClient) -> None:
    body = client.post("/api/attention", json={"text": TEXT, "model": "random"}).json()
    assert (body["model"], body["layers"], body["heads"]) == ("random", 4, 8)
    rows = torch.tensor(body["attention"], dtype=torch.float64).sum(-1)
    # rows of 6-decimal values, summed in float64
    bound = tolerances.rounded_row_sum(body["n"])
    torch.testing.assert_close(rows, torch.ones_like(rows), atol=bound, rtol=0)
    entry = next(m for m in client.get("/api/models").json()["models"] if m["name"] == "random")
    assert entry["loaded"] is True and entry["pretrained"] is False and entry["family"] == "random"


# -- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["/api/attention", "/api/attention/compact"])
@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"text": ""}, "text"),
        ({"text": "   \n\t "}, "blank"),
        ({}, "text is empty: give a text, or a probe"),
        ({"text": 42}, "text"),
        ({"text": ["a"]}, "text"),
        ({"text": "ok", "model": 3}, "model"),
        ({"text": "ok", "extra": 1}, "extra"),
        ({"text": "x" * 20_001}, "text"),
        ([1, 2], "body"),
    ],
)
def test_bad_bodies_are_422_readably(client: TestClient, route: str, body: object, needle: str) -> None:
    r = client.post(route, json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str) and needle in detail


def test_text_without_tokens_is_422(client: TestClient) -> None:
    r = client.post("/api/attention", json={"text": "\u200b\u200b"})  # zero-width spaces: no tokens
    assert r.status_code == 422, r.text
    assert "token" in r.json()["detail"]


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b'{"text": ', "malformed JSON"),
        (b"{'text': 'single quotes'}", "malformed JSON"),
        (b'{"text": "caf\xe9"}', "UTF-8"),  # latin-1 byte, invalid UTF-8
        (b"\xff\xfe\x00\x01", "JSON"),  # a UTF-16 BOM: decoded, then not JSON
    ],
)
def test_malformed_or_non_utf8_json_is_422(client: TestClient, raw: bytes, needle: str) -> None:
    r = client.post("/api/attention", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert needle in r.json()["detail"]


def test_non_json_content_type_is_422(client: TestClient) -> None:
    r = client.post("/api/attention", content=b'{"text": "hi"}', headers={"Content-Type": "text/plain"})
    assert r.status_code == 422
    assert "application/json" in r.json()["detail"]


@pytest.mark.parametrize("name", ["../etc", "/etc/passwd", "..", "m/../../x", "bert\n", "C:\\x", "unknown"])
@pytest.mark.parametrize("route", ["/api/attention", "/api/attention/compact", "/api/attention/head"])
def test_unknown_or_path_like_model_is_404_listing_names(client: TestClient, name: str, route: str) -> None:
    body = {"text": TEXT, "model": name} | ({"layer": 0, "head": 0} if route.endswith("head") else {})
    r = client.post(route, json=body)
    assert r.status_code == 404, r.text
    detail = r.json()["detail"]
    assert "all-MiniLM-L6-v2" in detail and "random" in detail
    assert "\n" not in detail  # the name is shown with repr(), never raw


def test_huge_body_with_content_length_is_413(client: TestClient) -> None:
    r = client.post("/api/attention", json={"text": "a" * 70_000})
    assert r.status_code == 413
    assert "65536" in r.json()["detail"]
    assert r.headers["x-frame-options"] == "DENY"


def test_huge_chunked_body_without_content_length_is_413(client: TestClient) -> None:
    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"text": "'
        for _ in range(100):
            yield b"a" * 1000
        yield b'"}'

    r = client.post("/api/attention", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in r.request.headers
    assert r.status_code == 413
    assert "65536" in r.json()["detail"]


def test_chunked_body_within_limit_is_served(client: TestClient) -> None:
    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"text": '
        yield json.dumps(TEXT).encode()
        yield b"}"

    r = client.post("/api/attention", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 200
    assert r.json()["tokens"][0] == "[CLS]"


def test_openapi_documents_the_compact_format(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    compact = spec["paths"]["/api/attention/compact"]["post"]
    assert "HSA1" in compact["description"] and "1/510" in compact["description"]
    assert "application/vnd.headscope.attention" in compact["responses"]["200"]["content"]
    assert "truncated" in spec["paths"]["/api/attention"]["post"]["description"]
    assert spec["components"]["schemas"]["AttentionRequest"]["additionalProperties"] is False


# -- /api/attention/head/compact and the key-major scheme ---------------------------------------------


def decode_head_hsa1(buffer: bytes) -> tuple[dict, np.ndarray]:
    """An independent reading of the head route's table: float32 values, bytes grouped by significance."""
    assert buffer[:4] == b"HSA1"
    h = struct.unpack("<I", buffer[4:8])[0]
    header = json.loads(buffer[8 : 8 + h])
    start = 8 + h + (4 - (8 + h) % 4) % 4
    n = header["n"]
    planes = np.frombuffer(buffer[start:], dtype=np.uint8)
    assert planes.size == 4 * n * n, "no trailing or missing bytes"
    # plane k holds byte k (little-endian) of every value
    values = planes.reshape(4, n * n).T.copy().view("<f4").reshape(n, n)
    return header, values


@pytest.mark.parametrize("words", [False, True])
def test_head_compact_is_the_json_head_exactly(client: TestClient, words: bool) -> None:
    body = {"text": TEXT, "text_pair": PAIR, "layer": 3, "head": 7, "words": words}
    r = client.post("/api/attention/head/compact", json=body)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/vnd.headscope.attention"
    assert r.headers["content-encoding"] == "gzip"
    assert "accept-encoding" in r.headers["vary"].lower()
    header, values = decode_head_hsa1(r.content)
    reference = client.post("/api/attention/head", json=body).json()
    assert header["tokens"] == reference["tokens"]
    assert (header["layers"], header["heads"], header["layer"], header["head"]) == (1, 1, 3, 7)
    assert header["quantization"] == {
        "scheme": "float32-shuffled",
        "order": "query-major",
        "max_abs_error": 0,
    }
    assert 1 in header["segments"] and header["causal"] is False
    # Exact: the same float32 values the JSON head carries at full precision.
    assert np.array_equal(values, np.array(reference["attention"], dtype=np.float32))


def test_head_compact_costs_a_fraction_of_the_json(client: TestClient) -> None:
    text = " ".join(f"Sentence number {i} says something different about cats and dogs." for i in range(10))
    body = {"text": text, "layer": 0, "head": 0}
    r = client.post("/api/attention/head/compact", json=body)
    n = decode_head_hsa1(r.content)[0]["n"]
    assert n > 100
    wire = int(r.headers["content-length"])
    json_bytes = len(client.post("/api/attention/head", json=body).content)
    # float32 is 4 bytes a value; grouped exponent bytes gzip, the noisy mantissa bytes do not.
    assert wire < 4 * n * n and wire < json_bytes / 5, (wire, json_bytes, n)
    identity = client.post("/api/attention/head/compact", json=body, headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in identity.headers
    assert decode_head_hsa1(identity.content)[1].shape == (n, n)


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"text": TEXT, "layer": 6, "head": 0}, 422, ["layer 6", "0..5"]),
        ({"text": TEXT, "layer": 0, "head": 12}, 422, ["head 12", "0..11"]),
        ({"text": TEXT, "layer": -1, "head": 0}, 422, ["layer"]),
        ({"text": TEXT}, 422, ["layer", "head"]),
        ({"text": "   ", "layer": 0, "head": 0}, 422, ["blank"]),
        ({"text": TEXT, "layer": 0, "head": 0, "model": "nope"}, 404, ["all-MiniLM-L6-v2"]),
    ],
)
def test_head_compact_refuses_bad_input_in_words(
    client: TestClient, body: dict, status: int, words: list[str]
) -> None:
    r = client.post("/api/attention/head/compact", json=body)
    assert r.status_code == status
    assert r.headers["content-type"] == "application/json"
    assert all(word in r.json()["detail"] for word in words), r.json()


def test_key_major_scheme_is_abs_uint8_transposed(client: TestClient, minilm) -> None:  # type: ignore[no-untyped-def]
    rows = client.post("/api/attention/compact?scheme=abs-uint8", json={"text": TEXT})
    columns = client.post("/api/attention/compact?scheme=abs-uint8-key-major", json={"text": TEXT})
    header, _ = decode_hsa1(columns.content)
    assert header["quantization"]["order"] == "key-major"
    assert header["quantization"]["max_abs_error"] == pytest.approx(1 / 510)
    L, H, n = header["layers"], header["heads"], header["n"]
    start = len(columns.content) - L * H * n * n  # q is the tail of the buffer, scales before it
    q_columns = np.frombuffer(columns.content[start:], dtype=np.uint8).reshape(L, H, n, n)
    q_rows = np.frombuffer(rows.content[len(rows.content) - L * H * n * n :], dtype=np.uint8).reshape(
        L, H, n, n
    )
    assert np.array_equal(q_columns, q_rows.swapaxes(-1, -2))
    # Read with its order, it is the model's attention within the stated bound.
    values = q_columns.swapaxes(-1, -2).astype(np.float64) / 255
    assert np.abs(values - minilm.attend(TEXT).attentions.double().numpy()).max() <= quant8() + FORWARD


def test_openapi_documents_the_head_compact_format(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    route = spec["paths"]["/api/attention/head/compact"]["post"]
    assert "HSA1" in route["description"] and "float32-shuffled" in route["description"]
    assert "application/vnd.headscope.attention" in route["responses"]["200"]["content"]
    assert route["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/HeadRequest")
    scheme = spec["paths"]["/api/attention/compact"]["post"]["parameters"][0]["schema"]
    assert "abs-uint8-key-major" in scheme["enum"]
