"""Many clients at once: every answer right, each model loaded once, inference bounded per model."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from tolerances import FORWARD_JSON

from app.main import create_app
from app.service import Batcher, Job
from tests.app.started import serving

TEXTS = [
    f"Request number {i} asks about {word}." for i, word in enumerate(["cats", "dogs", "owls", "bees"] * 4)
]


def test_concurrent_requests_right_loaded_once_bounded_deduplicated(make_settings, minilm) -> None:  # type: ignore[no-untyped-def]
    # max_batch=2: the 8 distinct texts on "random" need at least 4 forwards, so two can overlap.
    app = create_app(make_settings(max_concurrency=2, max_batch=2))
    service = app.state.service
    loads = {"random": 0}
    in_flight = {"now": 0, "peak": 0}
    computed: list[str] = []
    lock = threading.Lock()
    # The first two forwards wait for each other: the peak reaches 2 only if two really run at once
    # (a barrier that breaks means they could not), and any third would push it past 2.
    both_running = threading.Barrier(2, timeout=30)
    broken: list[bool] = []
    calls = {"n": 0}

    entry = next(e for e in service.models.registry if e.name == "random")
    original_loader = entry.loader

    def counting_loader() -> Any:
        with lock:
            loads["random"] += 1
        model = original_loader()
        original_attend_batch = model.attend_batch

        def attend_batch(items: list[Any], **kwargs: Any) -> Any:
            with lock:
                in_flight["now"] += 1
                in_flight["peak"] = max(in_flight["peak"], in_flight["now"])
                computed.extend(text for text, _ in items)
                calls["n"] += 1
                first_two = calls["n"] <= 2
            try:
                if first_two:
                    try:
                        both_running.wait()
                    except threading.BrokenBarrierError:
                        broken.append(True)
                return original_attend_batch(items, **kwargs)
            finally:
                with lock:
                    in_flight["now"] -= 1

        model.attend_batch = attend_batch
        return model

    entry.loader = counting_loader

    with serving(app) as client:

        def ask(i: int) -> tuple[int, dict[str, Any]]:
            model = "random" if i % 2 else None  # half on the lazily loaded model, half on the default
            r = client.post("/api/attention", json={"text": TEXTS[i % len(TEXTS)], "model": model})
            return i, r.json() | {"status": r.status_code}

        with ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(pool.map(ask, range(48)))

    assert all(body["status"] == 200 for _, body in answers)
    assert loads == {"random": 1}
    assert not broken, "two forwards never ran at once"
    assert in_flight["peak"] == 2  # max_concurrency forwards ran at once on one model, never more
    # each distinct text ran exactly once: identical requests in flight shared it, later ones hit the cache
    assert sorted(computed) == sorted({TEXTS[i % len(TEXTS)] for i in range(48) if i % 2})
    for i, body in answers:
        text = TEXTS[i % len(TEXTS)]
        assert body["model"] == ("random" if i % 2 else "all-MiniLM-L6-v2")
        if not i % 2:  # the default: compare with mha directly, so no answer was swapped with another
            expected = minilm.attend(text)
            assert body["tokens"] == expected.tokens
            got = torch.tensor(body["attention"], dtype=torch.float64)
            # Two separate forward passes (other batch shapes, another summation order) and the JSON's
            # 6-decimal rounding: well below any swapped answer, which differs by ~0.1.
            torch.testing.assert_close(got, expected.attentions.double(), atol=FORWARD_JSON, rtol=0)
        else:
            assert body["tokens"][1 : 1 + 3] == minilm.attend(text).tokens[1 : 1 + 3]  # same tokenizer


def test_identical_requests_are_served_from_the_cache(make_settings) -> None:  # type: ignore[no-untyped-def]
    app = create_app(make_settings())
    with serving(app) as client:
        cache = app.state.service.answers.cache
        first = client.post("/api/attention/compact", json={"text": "cache me"})
        misses = cache.misses
        again = [client.post("/api/attention/compact", json={"text": "cache me"}) for _ in range(5)]
        assert all(r.content == first.content for r in again)
        assert cache.misses == misses  # no new computation, all hits
        assert cache.hits >= 5


def test_batcher_runs_waiting_jobs_together() -> None:
    gate, entered = threading.Event(), threading.Event()
    batches: list[list[str]] = []

    def run(jobs: list[Job]) -> None:
        entered.set()
        gate.wait(5)  # the first job holds the only worker while the others queue up
        batches.append([job.text for job in jobs])
        for job in jobs:
            job.future.set_result(job.text.upper())  # type: ignore[arg-type]

    batcher = Batcher(run, workers=1, max_batch=3, name="t")
    futures = [batcher.submit("t0", None)]
    assert entered.wait(5)
    futures += [batcher.submit(f"t{i}", None) for i in range(1, 6)]
    gate.set()
    assert [f.result(5) for f in futures] == [f"T{i}" for i in range(6)]
    assert batches == [["t0"], ["t1", "t2", "t3"], ["t4", "t5"]]
    batcher.close()  # as the lifespan does at shutdown; a later submit (a restarted app) gets new workers
    assert batcher.submit("again", None).result(5) == "AGAIN"
    batcher.close()


def test_short_jobs_go_before_long_ones_unless_a_long_one_waited_long_enough() -> None:
    gate, entered = threading.Event(), threading.Event()
    order: list[list[str]] = []

    def run(jobs: list[Job]) -> None:
        entered.set()
        gate.wait(5)
        order.append([job.text for job in jobs])
        for job in jobs:
            job.future.set_result(job.text)  # type: ignore[arg-type]

    def is_long(job: Job) -> bool:
        return job.text.startswith("long")

    batcher = Batcher(run, workers=1, max_batch=8, name="t", is_long=is_long, long_wait=0.3)
    first = batcher.submit("hold", None)
    assert entered.wait(5)
    futures = [batcher.submit(text, None) for text in ("long 1", "short 1", "long 2", "short 2")]
    gate.set()
    assert [f.result(5) for f in [first, *futures]] == ["hold", "long 1", "short 1", "long 2", "short 2"]
    # The short ones ran together first; the long ones one at a time, in order.
    assert order == [["hold"], ["short 1", "short 2"], ["long 1"], ["long 2"]]

    gate.clear()
    entered.clear()
    order.clear()
    first = batcher.submit("hold", None)
    assert entered.wait(5)
    late = batcher.submit("long 3", None)
    time.sleep(0.4)  # longer than long_wait: this long job has waited enough to go first
    futures = [late, batcher.submit("short 3", None)]
    gate.set()
    assert [f.result(5) for f in futures] == ["long 3", "short 3"]
    assert order == [["hold"], ["long 3"], ["short 3"]]
    batcher.close()


def test_a_bad_input_does_not_fail_its_batch_mates(make_settings) -> None:  # type: ignore[no-untyped-def]
    # One worker: while it runs the first text, the other seven queue up and are then taken as one batch.
    app = create_app(make_settings(max_concurrency=1, max_batch=8))
    bad = ["\u200b", "\u200b\u200b", "\u200b\u200b\u200b"]  # zero-width spaces: no tokens (distinct texts)
    texts = ["Good text number 0."] + [
        bad[i // 2] if i % 2 else f"Good text number {i}." for i in range(1, 7)
    ]
    texts.append("Good text number 7.")
    calls: list[tuple[list[str], bool]] = []  # (texts of one forward, whether it raised)
    entered = threading.Event()
    with serving(app) as client:
        service = app.state.service
        model = service.models.registry.loaded(service.models.registry.default)
        original = model.attend_batch

        def attend_batch(items: list[Any], **kwargs: Any) -> Any:
            if not calls:  # the first forward holds the only worker until the rest are queued
                entered.set()
                deadline = time.monotonic() + 30
                while (
                    service.forwards.queued(service.models.registry.default) < len(texts) - 1
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.01)
            calls.append(([text for text, _ in items], False))
            try:
                return original(items, **kwargs)
            except Exception:
                calls[-1] = (calls[-1][0], True)
                raise

        model.attend_batch = attend_batch

        def ask(text: str) -> int:
            return client.post("/api/attention/compact", json={"text": text}).status_code

        with ThreadPoolExecutor(max_workers=len(texts)) as pool:
            first = pool.submit(ask, texts[0])
            assert entered.wait(30)
            statuses = [first] + [pool.submit(ask, text) for text in texts[1:]]
            results = [f.result() for f in statuses]

    assert results == [422 if text in bad else 200 for text in texts]
    mixed = [(batch, raised) for batch, raised in calls if len(batch) > 1]
    assert len(mixed) == 1, calls  # the seven waiting texts ran as one batch...
    batch, raised = mixed[0]
    assert sorted(batch) == sorted(texts[1:]) and raised  # ...which the bad inputs failed...
    alone = [batch[0] for batch, _ in calls[calls.index(mixed[0]) + 1 :]]
    assert sorted(alone) == sorted(texts[1:])  # ...so each of its texts then ran alone
