"""Property-based fuzz of the OpenAPI contract: every schemathesis check, every route, every family.

The app serves the embedded default, "random", and a tiny checkpoint of each family in tests/checkpoints.py
FAMILIES, a tiny T5 (an encoder-decoder: tests/seq2seq_checkpoints.py) and the tiny Llama as a Q8_0 GGUF
file (tests/gguf_files.py, converted on first use); a family added there is fuzzed
here with no other change. Stand-in ollama and LM Studio stores add every way a store entry can fail to
load (BROKEN), each a model of its own that every route must refuse with a 503 naming its reason. The
corpus routes read a run folder written by tests/corpus_fixture.py. Each route is fuzzed once as
schemathesis generates its requests (the schema's `model` is an enum of the registered names) and once per
family with the schema-valid requests, every `model` the request names set to that family. Its
schema-invalid requests run once a route (test_no_invalid_input_breaks_the_contract_on_any_family): the
request validator refuses one before any model is read, whatever family it names, and one that the
validator lets through is sent to every family. The answers that a schema-valid request
may still get (413, and 422 for what depends on the model) are declared in schemathesis.toml, which the
schemathesis CLI reads too; here a 422 for a schema-valid request must also come from the service, not
from the request validator (which would mean that schema and validator disagree).

Each failure mode of a model file is a model of its own (HOSTILE, issue 33): one whose chat template fails,
one whose forward overflows float32. Each is refused with its sentence on every route that reaches it, and
no answer of any model holds a bare NaN.
"""

from __future__ import annotations

import atexit
import copy
import importlib
import json
import re
import shutil
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from checkpoints import FAMILIES, build_tiny_checkpoints
from corpus_fixture import STATS, random_values, sentences, write_run
from edited import overflowing
from gguf_files import write_gguf
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.config import ProjectConfig, SchemathesisConfig
from schemathesis.python import asgi
from seq2seq_checkpoints import build_seq2seq_checkpoint
from store_files import OLLAMA_MODEL, hf_snapshot, lmstudio_model, ollama_manifest, ollama_model

from app import errors
from app.main import create_app
from app.schemas.attention import NO_TEXT, PROBE_ALONE
from app.schemas.common import MAX_TEXT_CHARS, NOT_BLANK
from app.settings import Settings
from mha.loading.gguf import folders as model_cache
from tests.app.started import serving

ROOT = Path(__file__).resolve().parents[2]
# Built at import, as the app is: schemathesis reads the schema, and so starts the app, at collection.
CHECKPOINTS = Path(tempfile.mkdtemp(prefix="headscope-fuzz-"))
atexit.register(shutil.rmtree, CHECKPOINTS, ignore_errors=True)
build_tiny_checkpoints(CHECKPOINTS)
# An encoder-decoder answers every route but the long-input traces and head effects (422: it has neither).
SEQ2SEQ = ("t5",)
for _family in SEQ2SEQ:
    build_seq2seq_checkpoint(_family, CHECKPOINTS / _family)
# A decoder read from a GGUF file (the tiny Llama in Q8_0), converted on its first request into a cache
# folder of this module's own (see _lifespan).
GGUF = "gguf-llama"
write_gguf(CHECKPOINTS / "llama", CHECKPOINTS / f"{GGUF}.gguf", qtype="Q8_0")
# Store entries that cannot load (issue 34 item 3), each a model of its own in a stand-in ollama store: the
# models list names each with its reason, and every route that names one answers 503 with that reason.
STORES = {key: CHECKPOINTS / "stores" / key for key in ("ollama_models", "lmstudio_models", "hf_cache")}
for _folder in STORES.values():
    _folder.mkdir(parents=True)
_LIBRARY = ("registry.ollama.ai", "library")
_layer = {"mediaType": OLLAMA_MODEL, "digest": "sha256:../../etc/passwd"}
ollama_manifest(STORES["ollama_models"], (*_LIBRARY, "escape", "latest"), [_layer])
ollama_manifest(STORES["ollama_models"], (*_LIBRARY, "text", "latest"), "not json")
ollama_manifest(
    STORES["ollama_models"], (*_LIBRARY, "gone", "latest"), [{**_layer, "digest": "sha256:" + "0" * 64}]
)
ollama_model(STORES["ollama_models"], (*_LIBRARY, "notgguf", "latest"), b"not a model")
ollama_model(
    STORES["ollama_models"],
    (*_LIBRARY, "bert", "latest"),
    write_gguf(CHECKPOINTS / "llama", CHECKPOINTS / "bert.gguf", architecture="bert"),
)
lmstudio_model(STORES["lmstudio_models"], "pub", "model", "cut.gguf", b"GGUF" + bytes(4))
(CHECKPOINTS / "split").mkdir()  # a GGUF repo in the hub cache holding a split GGUF
shutil.copyfile(CHECKPOINTS / f"{GGUF}.gguf", CHECKPOINTS / "split" / "m-00001-of-00002.gguf")
hf_snapshot(STORES["hf_cache"], "org/split-GGUF", CHECKPOINTS / "split")
BROKEN = {
    "escape:latest": "is not sha256:<64 hex digits>",
    "text:latest": "is not JSON",
    "gone:latest": "is missing",
    "notgguf:latest": "is not a GGUF file",
    "bert:latest": "architecture 'bert'",
    "pub/model/cut": "not a readable GGUF file",
    "org/split-GGUF/m-00001-of-00002": "parts of a split GGUF",
}
# Failure modes of a model file, each a copy of the tiny Llama: TEMPLATE's chat template raises on a text
# of odd length and writes past the render's output bound (mha.text.chat) on the others (a loop would cost
# its time bound and a worker's restart per render: tests/app/test_chat_template_api.py has it), and
# every request naming it asks for its chat; OVERFLOWING's finite weights overflow float32 in every forward
# (tests/edited.py). Each value: what every refusal of it says.
TEMPLATE, OVERFLOWING = "hostile-template", "overflowing"
HOSTILE = {TEMPLATE: "model's chat template ", OVERFLOWING: f"{OVERFLOWING!r} computed NaN or an infinity"}
shutil.copytree(CHECKPOINTS / "llama", CHECKPOINTS / TEMPLATE)
(CHECKPOINTS / TEMPLATE / "chat_template.jinja").write_text(
    "{% if messages[0].content|length is odd %}{{ raise_exception('no turn of odd length') }}"
    "{% else %}{{ 'x' * 2000000 }}{% endif %}"
)
overflowing(CHECKPOINTS / "llama", CHECKPOINTS / OVERFLOWING)
NO_FORWARD = ("POST /api/trace/tokens",)  # the one route that reads no model's weights: tokens only
# The routes that start no work: they watch what is in flight (nothing, here), so every model answers.
NO_WORK = ("POST /api/attention/progress",)
# The routes whose body takes no text, so no chat template: TEMPLATE's chat is never reached there (the head
# probe runs random token ids).
NO_CHAT = ("POST /api/probe",)
MODELS = FAMILIES + SEQ2SEQ + (GGUF, *HOSTILE)
NO_SEQ2SEQ = ("POST /api/trace",)  # the routes an encoder-decoder gets 422 on
FLOW_MAX_TOKENS = 6
# A finished corpus run of 2 layers x 2 heads, named where the drawn name is a valid one (see _corpus).
RUN = "fuzz-run"
RUNS = CHECKPOINTS / "runs"
RUN_TEXTS = 6
write_run(RUNS / RUN, sentences(RUN_TEXTS), random_values(RUN_TEXTS, 2, 2), model=FAMILIES[0])

# max_tokens caps the cost of each example; flow_max_tokens keeps an attention-flow example to
# milliseconds (its cost grows as n⁴). The cache stays on: repeated examples are common, and it is the
# production path. Its room (cache_size; the bytes bound stays the default's) keeps a forward's result while
# the per-family fuzz sends the same boundary inputs to route after route, as a page asks one input's
# routes: at the default 64 entries each route computed them again (the fuzz alone 105 -> 85 s on a quiet
# 2-core machine; 100,000 entries gain nothing more). "testserver" is the Host of schemathesis's ASGI client.
app = create_app(
    Settings(
        device="cpu",
        threads=1,
        log_level="warning",
        models={family: CHECKPOINTS / family for family in FAMILIES + SEQ2SEQ + tuple(HOSTILE)}
        | {GGUF: CHECKPOINTS / f"{GGUF}.gguf"},
        max_tokens=32,
        cache_size=4096,
        flow_max_tokens=FLOW_MAX_TOKENS,
        allowed_hosts=["testserver"],
        runs_dir=RUNS,
        # Not the bundled SmolLM2: its first request converts 98 MB (~15 s, past the examples' 10 s read
        # timeout), and its family and format are fuzzed here already as gguf-llama (a Q8_0 GGUF Llama);
        # tests/app/test_bundled_llm.py covers its routes.
        bundled_llm=False,
        discover=True,  # the stand-in stores above only: every folder is set
        **STORES,
    )
)


def _as_written(pattern: str, min_length: int | None, max_length: int | None) -> str:
    return pattern


# schemathesis folds a string's length bounds into its pattern before drawing from it: the request texts'
# NOT_BLANK class (one character that is no blank, anywhere in the text) and maxLength 20,000 (200,000 for
# the traces) become ^[...]{1,20000}$. That spends most of the fuzz: jsonschema_rs canonicalizes each
# schema holding such a quantifier in 2-6 s (linear in the bound; ~50 schemas at collection, more as
# strategies are built), 40 % of this process's time in a py-spy sample. It also narrows the positive
# draws to texts with no blank at all. Drawn from the pattern as written, with the bounds left to the
# length filter, the fuzz of one route set is 3.3x faster (120 vs 393 s, under load 11) and draws more
# cases, long texts at the bounds included (2,056 vs 1,687 requests; 16 vs 9 texts of 20,000 characters
# or more). The three places that fold (converting a schema, the coverage phase, a pattern's strategy)
# all call update_quantifier; where a schemathesis version has moved it, nothing is replaced.
for _folding in (
    "schemathesis.specs.openapi.converter",
    "schemathesis.specs.openapi.coverage._operation",
    "schemathesis.generation.jsonschema.strategy",
):
    try:
        _module = importlib.import_module(_folding)
    except ModuleNotFoundError:
        continue
    if hasattr(_module, "update_quantifier"):
        _module.update_quantifier = _as_written


def _memoized(method: Any) -> Any:
    """`method(config, operation=..., phase=...)`, computed once for each config, operation and phase."""
    found: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    def memo(self: Any, *, operation: Any = None, **phase: Any) -> Any:
        key = (id(self), None if operation is None else operation.label, *sorted(phase.items()))
        if key not in found or found[key][0] is not self:  # the config is kept with it: no id reused
            found[key] = (self, method(self, operation=operation, **phase))
        return found[key][1]

    return memo


# schemathesis merges a config's hierarchy (the project, schemathesis.toml's [[operations]], the phase)
# afresh each time it draws or checks a case: a third of the fuzz's own time in a py-spy sample, for
# configs that never change once the schemas below are built. Where a version has renamed these, nothing
# is replaced.
for _merged in ("phases_for", "checks_config_for"):
    if hasattr(ProjectConfig, _merged):
        setattr(ProjectConfig, _merged, _memoized(getattr(ProjectConfig, _merged)))


# A bound on each request that must end, not a timed check: schemathesis's own 10 s read timeout failed a
# 0.1 s request of the per-family fuzz (phi3, /api/attention/head/compact) once, with both lanes of
# `make test` and other work on a 2-core machine (load average 4). A request that hangs still fails.
REQUEST_GUARD_S = 120


def _schema(*modes: GenerationMode) -> Any:
    """The app's schema under schemathesis.toml, drawing requests in `modes` (default: both)."""
    config = SchemathesisConfig.from_path(ROOT / "schemathesis.toml")
    config.projects.default.update(request_timeout=REQUEST_GUARD_S)
    if modes:
        config.projects.default.generation.update(modes=list(modes))
    return schemathesis.openapi.from_asgi("/openapi.json", app, config=config)


schema = _schema()
# As generated: the insight routes (tag "insight") share the attention's inputs and code path up to the
# analysis, and compare runs two forwards, so they get fewer examples; so does the snapshot (tag
# "snapshot"), which shares them up to its forward and then builds a 2 MB file. Per family: the routes that
# take a model, with fewer examples again (the coverage phase adds its boundary cases to each).
core = schema.exclude(tag="insight").exclude(tag="snapshot")
insight = schema.exclude(tag="api")
with_model = schema.exclude(method="GET")
# The per-family fuzz, split by mode: each family gets the schema-valid requests; the schema-invalid ones
# (about 60 a route, most from the coverage phase) are the same requests for every family (derandomize:
# the same draws, only `model` steered), and the request validator refuses each alike, having no model in
# it: they run once a route, on every family only where the validator let one through.
valid_with_model = _schema(GenerationMode.POSITIVE).exclude(method="GET")
invalid_with_model = _schema(GenerationMode.NEGATIVE).exclude(method="GET")

# One client for every call, as one for each call is what case.call() makes: a requests Session, its
# adapters, and (trust_env) the proxy variables and ~/.netrc read again for each request, 4 ms of each
# call's 14 on a 2-core machine, ~20,000 times here. The app's lifespan is _lifespan's.
CLIENT = asgi.get_client(app)
CLIENT.trust_env = False
# Each request as sent (steered) -> how often it was drawn. Steering makes many draws one request: the
# coverage phase draws each registered name of the `model` enum (~20), and _steer names the family for each.
# Of the per-family fuzz's calls, 45 % repeated one already sent. The same request to the same app gets the
# same answer, so each is sent twice (the second time, on a route that caches, the cache answers it) and
# further draws of it are not.
sent: Counter[str] = Counter()

# "POST /path" -> the models that answered it with a 200.
answered: defaultdict[str, set[str]] = defaultdict(set)
# "POST /path" -> the HOSTILE models refused there with their sentence (a 422's, or a stream's last line).
hostile_refused: defaultdict[str, set[str]] = defaultdict(set)
# What the request validator said while the current example ran (errors.describe_validation).
refusals: list[str] = []
# The refusals of the validator that a schema-valid body may get: rules between fields that the schema
# does not state (the fields' descriptions do): a target or generate; a text or a probe, the probe alone.
UNSTATED_RULES = ("send a target or generate: true, not both", NO_TEXT, PROBE_ALONE)


@pytest.fixture(scope="module", autouse=True)
def _lifespan() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(model_cache.CACHE_ENV, str(CHECKPOINTS / "headscope-cache"))
        with serving(app):  # the default model is loaded before the first example, as in production
            yield


@pytest.fixture(scope="module", autouse=True)
def _validator_refusals() -> Iterator[None]:
    """Record each refusal of the request validator, so a 422 says whose it is."""
    describe = errors.describe_validation

    def recorded(*args: Any) -> str:
        detail = describe(*args)
        refusals.append(detail)
        return detail

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(errors, "describe_validation", recorded)
        yield


# derandomize: the same examples on every run, so that the family coverage checked last cannot flake.
@core.parametrize()
@settings(max_examples=50, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_input_breaks_the_contract(case) -> None:  # type: ignore[no-untyped-def]
    _check(case, None)


@insight.parametrize()
@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_insight_input_breaks_the_contract(case) -> None:  # type: ignore[no-untyped-def]
    _check(case, None)


@pytest.mark.parametrize("family", MODELS)
@valid_with_model.parametrize()
# 6 a route and family (beside the coverage phase's boundary cases): the model-free fuzz above draws 50 a
# route; here each family's own paths are reached, and the suite's 15 minutes leave ~3 for all of them.
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_input_breaks_the_contract_on_any_family(case, family: str) -> None:  # type: ignore[no-untyped-def]
    _check(case, family)


@invalid_with_model.parametrize()
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_invalid_input_breaks_the_contract_on_any_family(case) -> None:  # type: ignore[no-untyped-def]
    """The per-family fuzz's schema-invalid requests, each once, naming a family in turn by route; one
    that the request validator did not refuse (it reached the service, where the family may matter) is
    sent to every other family too, as the per-family fuzz sent each."""
    drawn = copy.deepcopy((case.body, case.path_parameters, case.query))
    turn = sorted(routes_of()).index(f"POST {case.path}") % len(MODELS)
    first, *others = MODELS[turn:] + MODELS[:turn]
    _check(case, first)
    if refusals:  # refused by the validator, which reads no model: every family gets this same refusal
        return
    for family in others:
        case.body, case.path_parameters, case.query = copy.deepcopy(drawn)
        _check(case, family)


@with_model.parametrize()
# Each route with one entry of BROKEN, in turn (each entry gets two or three routes): all are refused at
# the same place, the registry's lookup, whatever the route; every entry on every route took 7 minutes.
@settings(max_examples=2, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_a_store_entry_that_cannot_load_answers_its_reason(case) -> None:  # type: ignore[no-untyped-def]
    routes = sorted(path for path, methods in app.openapi()["paths"].items() if "post" in methods)
    _check(case, list(BROKEN)[routes.index(case.path) % len(BROKEN)])


def test_store_entries_that_cannot_load_are_listed_with_their_reason() -> None:
    models = {m.name: m for m in app.state.service.model_list().models}
    for name, reason in BROKEN.items():
        assert reason in (models[name].error or ""), (name, models[name])


@pytest.mark.parametrize("family", FAMILIES + SEQ2SEQ + (GGUF,))
def test_the_probe_input_answers_on_every_family(family: str) -> None:
    """The probe input whole (text "" beside `probe`, every other input field default), which the draws
    above seldom make: each family's attention, head, analysis and snapshot routes answer it; one length
    past the probe's bound for the service's 32 tokens ((32 - 1) // 2 = 15) is the service's 422."""
    body = {"model": family, "probe": {"seed": 1, "length": 3}}
    kind = "decoder" if family in SEQ2SEQ else "encoder"
    head = {"layer": 0, "head": 0, "kind": kind}
    for path, extra in [
        ("/api/attention", {}),
        ("/api/attention/compact", {}),
        ("/api/attention/head", head),
        ("/api/analysis", {}),
        ("/api/snapshot", {}),
    ]:
        response = CLIENT.post(f"http://testserver{path}", json={**body, **extra})
        assert response.status_code == 200, f"{family} {path}: {response.text[:300]}"
    over = CLIENT.post("http://testserver/api/attention", json={**body, "probe": {"length": 16}})
    assert over.status_code == 422 and "length (16) is over 15" in over.json()["detail"], over.text[:300]


def test_the_probe_input_of_an_overflowing_model_is_its_422() -> None:
    """The probe's ids through a model whose values overflow: refused with its sentence, as its texts are,
    never an answer of NaN maps."""
    body = {"model": OVERFLOWING, "probe": {"seed": 1, "length": 3}}
    for path in ("/api/attention", "/api/attention/compact"):
        response = CLIENT.post(f"http://testserver{path}", json=body)
        assert response.status_code == 422, f"{path}: {response.text[:300]}"
        assert HOSTILE[OVERFLOWING] in response.json()["detail"]


def _check(case, model: str | None) -> None:  # type: ignore[no-untyped-def]
    _corpus(case)
    inputs = _inputs(case.body)
    if model is not None:
        for part in inputs:
            _steer(part, model, flow=case.path == "/api/flow", chat=f"POST {case.path}" not in NO_CHAT)
    request = json.dumps(
        [case.method, case.path, case.path_parameters, case.query, case.headers, case.body],
        sort_keys=True,
        default=repr,
    )
    sent[request] += 1
    if sent[request] > 2:
        return  # answered and checked twice already
    refusals.clear()
    response = case.call(session=CLIENT)
    # The one documented 5xx is 503 for a registered model whose checkpoint is broken: here the store
    # entries of BROKEN, each answering with its reason.
    named = [name for part in inputs if isinstance(name := part.get("model"), str) and name in BROKEN]
    refused = response.status_code == 503 and bool(named)
    if refused:
        assert any(BROKEN[name] in response.json()["detail"] for name in named), response.text[:300]
    else:
        assert response.status_code < 500, (
            f"{case.method} {case.path} -> {response.status_code}: {response.text[:300]}"
        )
    # every check, as `schemathesis run --checks all` (less "no 5xx" for the documented 503 just checked)
    case.validate_response(response, excluded_checks=[not_a_server_error] if refused else None)
    # schemathesis.toml accepts a 422 for a schema-valid request (what depends on the model or the run);
    # the request validator's is not one (256.0 refused for an integer was): schema and validator disagree.
    if response.status_code == 422 and _schema_valid(case):
        unstated = [detail for detail in refusals if not any(rule in detail for rule in UNSTATED_RULES)]
        assert not unstated, (
            f"{case.method} {case.path}: the schema allows what the validator refused: {unstated} "
            f"(body {str(case.body)[:300]})"
        )
    route, names = f"{case.method} {case.path}", {str(part.get("model")) for part in inputs}
    detail = _strict_detail(response, route)
    if model is None and names & HOSTILE.keys():
        return  # chat as drawn: the contract above holds; their expectation is the per-family fuzz's
    hostile_refused[route].update(
        name for name in names & HOSTILE.keys() if detail and HOSTILE[name] in detail
    )
    if response.status_code == 200 and not (names & HOSTILE.keys() and detail):
        answered[route].update(names)


def _strict_detail(response, route: str) -> str | None:  # type: ignore[no-untyped-def]
    """Fails an answer holding a bare NaN or Infinity (no strict JSON parser reads one); returns the
    refusal's sentence: a JSON answer's `detail`, or the error event a progress stream ended with."""
    kind = (response.headers.get("content-type") or [""])[0]  # schemathesis: each header's values
    if not kind.startswith(("application/json", "application/x-ndjson")):
        return None  # HSA1 and HTML: no JSON to hold one

    def bare(constant: str) -> None:
        raise AssertionError(f"{route} answered a bare {constant}: {response.text[:300]}")

    lines = [json.loads(line, parse_constant=bare) for line in response.text.splitlines() if line.strip()]
    last = lines[-1] if lines else None
    if isinstance(last, dict) and (response.status_code != 200 or last.get("event") == "error"):
        return str(last.get("detail"))
    return None


def _schema_valid(case) -> bool:  # type: ignore[no-untyped-def]
    """Whether schemathesis drew every part of the request valid: its overall mode can say positive for
    a request whose body it drew invalid (the coverage phase, varying a query parameter)."""
    meta = case.meta
    return meta is not None and all(
        mode.is_positive for mode in (meta.generation.mode, *(part.mode for part in meta.components.values()))
    )


def _corpus(case) -> None:  # type: ignore[no-untyped-def]
    """On a corpus route, name the fuzz run (and a statistic it has) where the drawn value is valid, on
    every other draw (by length: stable across runs), so that answers past the lookup are fuzzed too."""
    params, query = case.path_parameters or {}, case.query or {}
    name, stat = params.get("name"), query.get("stat")
    if isinstance(name, str) and 0 < len(name) <= 255 and "/" not in name and len(name) % 2:
        params["name"] = RUN
    if isinstance(stat, str) and 0 < len(stat) <= 64 and len(stat) % 2:
        query["stat"] = STATS[len(stat) % len(STATS)]
    line = params.get("line")
    if isinstance(line, int) and not isinstance(line, bool) and line >= 1 and line % 2:
        params["line"] = 1 + line % RUN_TEXTS  # a line of the fuzz run: its text answers


def _inputs(body: Any) -> list[dict[str, Any]]:
    """The parts of a body that name a model: the body itself, or `a` and `b` of a comparison."""
    if not isinstance(body, dict):
        return []
    sides = [body[side] for side in ("a", "b") if isinstance(body.get(side), dict)]
    return sides or [body]


def _steer(part: dict[str, Any], model: str, *, flow: bool, chat: bool = True) -> None:
    """Name `model` where the drawn value is a valid one (absent, null or a registered name), so that a
    request stays as valid or invalid as it was drawn (and ask for TEMPLATE's chat where the body takes
    one: `chat`); for flow, cut valid texts to a character or two, so that most fit its token cap and
    reach the computation."""
    if part.get("model") is None or part["model"] in app.state.service.models.registry.names:
        part["model"] = model
    if chat and model == TEMPLATE and isinstance(part.get("chat", False), bool):  # its template reached
        part["chat"] = True
    if not flow:
        return
    text, pair = part.get("text"), part.get("text_pair")
    if isinstance(text, str) and _valid_text(text) and _valid_text(text[:2]):
        part["text"] = text[:2]
    if isinstance(pair, str) and len(pair) <= MAX_TEXT_CHARS:  # any such pair is valid, and so is its cut
        part["text_pair"] = pair[:1]


def _valid_text(text: str) -> bool:
    return 0 < len(text) <= MAX_TEXT_CHARS and re.search(NOT_BLANK, text) is not None


def routes_of() -> list[str]:
    """Every POST route, as `answered` and `hostile_refused` name them."""
    return [f"POST {path}" for path, methods in app.openapi()["paths"].items() if "post" in methods]


def test_every_route_answered_every_family() -> None:
    if not answered:
        pytest.skip("runs after the fuzz tests above")
    routes = routes_of()
    missing = {  # the HOSTILE models have a test of their own, below
        route: sorted(
            set((*FAMILIES, GGUF) if route.startswith(NO_SEQ2SEQ) else MODELS)
            - answered[route]
            - HOSTILE.keys()
        )
        for route in routes
    }
    assert not any(missing.values()), f"routes that never answered a family: {missing}"
    corpus = [f"GET {path}" for path in app.openapi()["paths"] if path.startswith("/api/corpus/")]
    assert len(corpus) == 4 and not [route for route in corpus if route not in answered], answered.keys()


def test_every_hostile_model_refused_where_reached() -> None:
    if not any(
        model in answered[route] | hostile_refused[route] for route in routes_of() for model in HOSTILE
    ):
        pytest.skip("runs after the fuzz tests above")
    routes = routes_of()

    # A HOSTILE model answers only where it is never reached (OVERFLOWING's tokens, NO_FORWARD; NO_WORK,
    # which starts nothing), and is refused with its sentence, never answered, everywhere else: every route
    # that works renders TEMPLATE's chat.
    def reached(model: str, route: str) -> bool:
        unread = (model == OVERFLOWING and route in NO_FORWARD) or (model == TEMPLATE and route in NO_CHAT)
        return route not in NO_WORK and not unread

    wrong = {
        route: [
            model
            for model in HOSTILE
            if (model in answered[route], model in hostile_refused[route])
            != ((False, True) if reached(model, route) else (True, False))
        ]
        for route in routes
    }
    assert not any(wrong.values()), f"hostile models answered, or never refused with their sentence: {wrong}"
