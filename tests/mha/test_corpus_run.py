"""mha.corpus.run end to end: the output files against head_stats and numpy by hand, bad rows, truncation,
resuming after a kill, refusing another run's folder."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from corpus_files import attend_as_the_worker, texts, write_jsonl, write_txt
from tolerances import batched_stat

from mha import load_pretrained
from mha.analysis import LABELS, detection_scores, head_chance, head_labels, head_stats
from mha.analysis.batched import STATS
from mha.corpus import MAX_CHARS, CorpusSettingsError, local_engine, read_records, run
from mha.corpus import aggregate as aggregate_module
from mha.corpus.aggregate import SNIPPET_CHARS, label_column
from mha.corpus.job import SCORES, STATISTICS
from mha.corpus.shards import shard_directory, shard_path
from mha.model import AttentionModel

ROOT = Path(__file__).resolve().parents[2]
SHARD, BATCH = 10, 4
# float64 sums of N values (numpy's mean, std and percentiles against ours, in another order): N·eps·max|x|
# at worst (Higham), eps = 2**-53; a few hundred texts and values below ~50 keep it under 1e-11.
FLOAT64 = 2.0**-53
# A detection score is one float32 rounding of a float64 share (mha.analysis.detection); the padded text's
# float64 sums and the text's own differ by ~n·2**-53, so the two roundings differ by at most one float32
# step, 2**-24 for a score below 1.
SCORE = 2.0**-24


def spelled_ids(tokens: list[str]) -> torch.Tensor:
    """One id per distinct spelling, in order of first appearance: a repeated spelling repeats a token."""
    seen: dict[str, int] = {}
    return torch.tensor([seen.setdefault(t, len(seen)) for t in tokens])


@pytest.fixture(scope="module")
def finished(minilm: AttentionModel, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """A finished run over 20 texts and 6 bad lines, 3 shards of 10 records, batches of 4."""
    root = tmp_path_factory.mktemp("run")
    source = root / "corpus.jsonl"
    write_jsonl(source, texts(20))
    summary = run(source, minilm, root / "out", batch=BATCH, shard_size=SHARD)
    return source, root / "out", summary


def table(out: Path, name: str) -> dict[str, np.ndarray]:
    """A run's file as numpy columns; a float column's null (an absent score) as NaN."""
    read = pq.read_table(out / f"{name}.parquet")
    return {
        k: read[k].to_numpy() if pa.types.is_floating(read.schema.field(k).type) else np.asarray(v)
        for k, v in read.to_pydict().items()
    }


def test_per_text_equals_head_stats_on_each_text_by_hand(finished, minilm: AttentionModel) -> None:
    """Each text's statistics against head_stats on its own map from the same padded forward (a shard's
    records in batches of BATCH, bad ones included, each cut as the worker cuts it), and its label against
    head_labels."""
    source, out, _ = finished
    per_text = table(out, "per_text")
    records = list(read_records(source))
    heads = minilm.info.layers * minilm.info.heads
    row = 0
    for shard_start in range(0, len(records), SHARD):
        shard = records[shard_start : shard_start + SHARD]
        for start in range(0, len(shard), BATCH):
            good = [r for r in shard[start : start + BATCH] if r.error is None]
            answers = attend_as_the_worker(minilm, [(r.text, r.text_pair) for r in good])
            for record, (result, width) in zip(good, answers, strict=True):
                stats = head_stats(result.attentions, result.tokens, special=result.special, causal=False)
                rows = slice(row, row + heads)
                assert set(per_text["line"][rows]) == {record.line}
                assert set(per_text["id"][rows]) == {record.id}
                assert set(per_text["n_tokens"][rows]) == {result.n}
                for stat in STATS:
                    expected = stats[stat].double().reshape(-1).numpy()
                    assert np.abs(per_text[stat][rows] - expected).max() <= batched_stat(stat, width), stat
                chance = head_chance(result.tokens, causal=False)  # the page's own rule: with induction
                labels = head_labels(stats, chance=chance)
                assert list(per_text["label"][rows]) == [x for layer in labels for x in layer]
                scores = detection_scores(result.attentions, spelled_ids(result.tokens))
                repeats = len(set(result.tokens)) < len(result.tokens)
                for kind in SCORES:
                    expected = scores[kind].double().reshape(-1).numpy()
                    got = per_text[kind][rows]  # a null (absent) reads as NaN
                    # absent exactly where the text repeats no token (previous_token: never, n >= 2)
                    assert (
                        np.isnan(got).all()
                        == np.isnan(expected).all()
                        == (kind != "previous_token" and not repeats)
                    )
                    assert np.array_equal(np.isnan(got), np.isnan(expected)), kind
                    assert np.nan_to_num(np.abs(got - expected)).max() <= SCORE, kind
                row += heads
    assert row == len(per_text["line"])
    assert list(per_text["layer"][:heads]) == [h // 12 for h in range(heads)]
    assert list(per_text["head"][:heads]) == [h % 12 for h in range(heads)]


def test_per_head_equals_numpy_over_per_text(finished) -> None:
    _, out, _ = finished
    per_text, per_head = table(out, "per_text"), table(out, "per_head")
    assert len(per_head["layer"]) == 72
    for index, (layer, head) in enumerate(zip(per_head["layer"], per_head["head"], strict=True)):
        mine = (per_text["layer"] == layer) & (per_text["head"] == head)
        assert per_head["count"][index] == mine.sum() == 20
        for stat in STATS:
            values = per_text[stat][mine]
            bound = len(values) * FLOAT64 * max(np.abs(values).max(), 1.0) * 4  # sum, square, root, divide
            expected = {
                "mean": values.mean(),
                "std": values.std(),
                **{f"p{q:02d}": np.percentile(values, q) for q in (5, 50, 95)},
            }
            for suffix, value in expected.items():
                assert abs(per_head[f"{stat}_{suffix}"][index] - value) <= bound, (stat, suffix)
        for kind in SCORES:  # over the texts that have the score only
            values = per_text[kind][mine]
            present = values[~np.isnan(values)]
            assert per_head[f"{kind}_count"][index] == len(present)
            bound = len(present) * FLOAT64 * 4  # as above, the scores in [0, 1]
            expected = {
                "mean": present.mean(),
                "std": present.std(),
                **{f"p{q:02d}": np.percentile(present, q) for q in (5, 50, 95)},
            }
            for suffix, value in expected.items():
                assert abs(per_head[f"{kind}_{suffix}"][index] - value) <= bound, (kind, suffix)
        labels = per_text["label"][mine]
        for label in LABELS:
            assert per_head[label_column(label)][index] == (labels == label).sum()
    assert "label_previous_token" in per_head and "label_first_token_sink" in per_head
    # Absent is null in the file, not 0 or NaN; this corpus has texts with and without a repeated token.
    stored = pq.read_table(out / "per_text.parquet", columns=list(SCORES))
    assert stored["previous_token"].null_count == 0
    for kind in ("duplicate_token", "induction"):
        assert 0 < stored[kind].null_count < stored.num_rows
        assert not np.isnan(stored[kind].drop_null().to_numpy()).any()
        assert 0 < min(per_head[f"{kind}_count"]) == max(per_head[f"{kind}_count"]) < 20


def test_per_head_in_groups_of_heads_equals_all_heads_at_once(
    finished, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget for 5 heads' values at a time (20 texts x 5 x 8 bytes; 72 is no multiple of 5, so the last
    group is short) gives the table all heads at once give: the same values through the same numpy calls
    per head column, so equal bits."""
    _, out, _ = finished
    files = [shard_path(out, k, ".parquet") for k in range(3)]
    whole = aggregate_module.per_head(files, 6, 12)
    monkeypatch.setattr(aggregate_module, "VALUES_BUDGET", 20 * 5 * 8)
    assert aggregate_module.per_head(files, 6, 12).equals(whole)


def test_examples_equal_a_sort_by_hand(finished) -> None:
    source, out, _ = finished
    per_text, examples = table(out, "per_text"), table(out, "examples")
    by_line = {r.line: r for r in read_records(source) if r.error is None}
    position = 0
    for flat in range(72):
        mine = (per_text["layer"] == flat // 12) & (per_text["head"] == flat % 12)
        for stat in STATISTICS:
            values, lines = per_text[stat][mine], per_text["line"][mine]
            kept = ~np.isnan(values)  # a score's texts that have it: the others are no example
            values, lines = values[kept], lines[kept]
            top = sorted(zip(-values, lines, strict=True))[:5]
            bottom = sorted(zip(values, lines, strict=True))[:5]
            for side, chosen, sign in (("top", top, -1), ("bottom", bottom, 1)):
                for rank, (key, line) in enumerate(chosen, start=1):
                    at = position
                    assert (examples["layer"][at], examples["head"][at]) == (flat // 12, flat % 12)
                    assert (examples["stat"][at], examples["side"][at], examples["rank"][at]) == (
                        stat,
                        side,
                        rank,
                    )
                    assert examples["line"][at] == line and examples["value"][at] == sign * key
                    record = by_line[int(line)]
                    assert examples["id"][at] == record.id
                    assert examples["snippet"][at] == record.text[:SNIPPET_CHARS]
                    pair = record.text_pair
                    assert examples["snippet_pair"][at] == (pair and pair[:SNIPPET_CHARS])
                    longer = len(record.text) > SNIPPET_CHARS or len(pair or "") > SNIPPET_CHARS
                    assert examples["cut"][at] == longer
                    position += 1
    assert position == len(examples["layer"])


def test_errors_and_run_json(finished) -> None:
    source, out, summary = finished
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [e["line"] for e in errors] == [3, 6, 9, 12, 15, 18]
    assert errors[1]["reason"] == "blank text" and errors[0]["reason"].startswith("invalid JSON")
    record = json.loads((out / "run.json").read_text())
    assert record == summary
    assert record["format"] == 2 and record["complete"] is True
    assert (record["name"], record["engine"], record["kind"]) == ("out", "local", "self")
    assert record["model"] == {
        "name": "all-MiniLM-L6-v2",
        "family": "bert",
        "architecture": "encoder",
        "layers": 6,
        "heads": 12,
    }
    assert record["input"]["name"] == "corpus.jsonl" and record["input"]["format"] == "jsonl"
    assert record["input"]["bytes"] == source.stat().st_size
    assert record["input"]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert record["settings"] == {
        "batch": BATCH,
        "words": False,
        "weighting": "weight",
        "shard_size": SHARD,
        "max_tokens": 512,
        "max_chars": MAX_CHARS,
    }
    assert record["counts"] == {"records": 26, "texts": 20, "errors": 6, "truncated": 0, "shards": 3}
    assert record["stats"] == [*STATS, *SCORES] == list(STATISTICS) and record["labels"] == list(LABELS)
    assert set(record["timings"]) >= {"seconds", "texts_per_second"}
    assert set(record["versions"]) >= {"headscope", "torch", "transformers", "pyarrow"}
    assert record["started"] <= record["finished"]


def test_a_finished_run_is_left_alone_and_another_is_refused(finished, minilm, tmp_path: Path) -> None:
    source, out, summary = finished
    before = {p: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()}
    assert run(source, minilm, out, batch=BATCH, shard_size=SHARD) == summary
    assert {p: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()} == before
    with pytest.raises(CorpusSettingsError, match=r"settings\.batch 4 there, 8 now"):
        run(source, minilm, out, batch=8, shard_size=SHARD)
    with pytest.raises(CorpusSettingsError, match=r"settings\.words False there, True now"):
        run(source, minilm, out, batch=BATCH, shard_size=SHARD, words=True)
    with pytest.raises(CorpusSettingsError, match=r"settings\.weighting 'weight' there, 'norm' now"):
        run(source, minilm, out, batch=BATCH, shard_size=SHARD, weighting="norm")
    with pytest.raises(ValueError, match=r"weighting \('size'\) must be one of weight, norm"):
        run(source, minilm, out, batch=BATCH, shard_size=SHARD, weighting="size")
    # A run written before --weighting has no weighting in its settings: it read the weights.
    older = json.loads((out / "run.json").read_text())
    del older["settings"]["weighting"]
    (out / "run.json").write_text(json.dumps(older))
    assert run(source, minilm, out, batch=BATCH, shard_size=SHARD) == older
    with pytest.raises(CorpusSettingsError, match=r"settings\.weighting 'weight' there, 'norm' now"):
        run(source, minilm, out, batch=BATCH, shard_size=SHARD, weighting="norm")
    (out / "run.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    other = tmp_path / "corpus.jsonl"  # the same name, other content
    write_jsonl(other, texts(21))
    with pytest.raises(CorpusSettingsError, match=r"input\.bytes .* input\.sha256"):
        run(other, minilm, out, batch=BATCH, shard_size=SHARD)


def test_truncated_texts_are_cut_and_flagged(minilm: AttentionModel, tmp_path: Path) -> None:
    source = tmp_path / "c.txt"
    items = texts(8)
    write_txt(source, items)
    summary = run(source, minilm, tmp_path / "out", max_tokens=12, shard_size=100)
    per_text = table(tmp_path / "out", "per_text")
    full = {
        r.line: len(minilm.encoder.encode_batch([(r.text, None)], 512)[0].ids)
        for r in read_records(source)
        if r.error is None
    }
    firsts = per_text["line"][::72]
    assert list(per_text["truncated"][::72]) == [full[line] > 12 for line in firsts]
    assert list(per_text["n_tokens"][::72]) == [min(full[line], 12) for line in firsts]
    assert summary["counts"]["truncated"] == sum(n > 12 for n in full.values()) > 0
    assert summary["counts"]["errors"] == 2


def test_a_decoder_and_an_encoder_decoder(tmp_path: Path, tiny_checkpoints, seq2seq_checkpoints) -> None:
    """A causal model's own attention ("self"; its first batch against head_stats by hand, causal); an
    encoder-decoder's encoder self-attention ("encoder")."""
    source = tmp_path / "c.txt"
    write_txt(source, texts(5))  # lines 2 and 5 are blank: the first batch of 3 holds lines 1 and 3
    for family, path, kind in (
        ("llama", tiny_checkpoints["llama"], "self"),
        ("bart", seq2seq_checkpoints["bart"], "encoder"),
    ):
        summary = run(source, str(path), tmp_path / family, device="cpu", batch=3)
        model = load_pretrained(path, device="cpu")
        assert summary["kind"] == kind and summary["model"]["name"] == family
        assert summary["model"]["architecture"] == model.info.architecture
        assert summary["model"]["layers"] == model.info.layers
        per_text = table(tmp_path / family, "per_text")
        heads = model.info.layers * model.info.heads
        assert len(per_text["line"]) == 5 * heads
        if kind == "self":
            for k, (result, width) in enumerate(attend_as_the_worker(model, texts(2))):
                stats = head_stats(result.attentions, result.tokens, special=result.special, causal=True)
                for stat in STATS:
                    got = per_text[stat][k * heads : (k + 1) * heads]
                    assert np.abs(got - stats[stat].double().reshape(-1).numpy()).max() <= batched_stat(
                        stat, width
                    )


def test_an_input_of_bad_rows_only(minilm: AttentionModel, tmp_path: Path) -> None:
    source = tmp_path / "c.txt"
    source.write_text("\n  \n")
    summary = run(source, minilm, tmp_path / "out")
    assert summary["counts"] == {"records": 2, "texts": 0, "errors": 2, "truncated": 0, "shards": 1}
    assert pq.read_table(tmp_path / "out" / "per_text.parquet").num_rows == 0
    assert pq.read_table(tmp_path / "out" / "examples.parquet").num_rows == 0
    assert pq.read_table(tmp_path / "out" / "per_head.parquet")["count"].to_pylist() == [0] * 72


DRIVER = """
import sys, time
from mha.corpus import run
pause = float(sys.argv[3])
run(sys.argv[1], None, sys.argv[2], batch=3, shard_size=5, device="cpu",
    progress=lambda done, total: time.sleep(pause))
"""


def _run_driver(source: Path, out: Path, pause: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(source), str(out), str(pause)], env=env, cwd=ROOT
    )


@pytest.mark.slow
def test_resume_after_a_kill_ends_with_the_same_files(tmp_path: Path) -> None:
    """Killed after its first shard, rerun with the same arguments: the files of an uninterrupted run.
    Every run is a subprocess, so all three compute under the same threads and give identical floats."""
    source = tmp_path / "c.jsonl"
    write_jsonl(source, texts(24))  # 30 records: 6 shards
    assert _run_driver(source, tmp_path / "whole", 0).wait(timeout=600) == 0
    # A pause after each of its 12 batches (2 a shard): once shard 0 is marked done, 10 pauses (5 s) are
    # still to come before all 6 shards are, time to kill it.
    killed = _run_driver(source, tmp_path / "resumed", 0.5)
    marker = tmp_path / "resumed" / "shards" / "00000.done.json"
    deadline = time.monotonic() + 300
    while not marker.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    state = json.loads((tmp_path / "resumed" / "run.json").read_text())
    assert state["complete"] is False
    done = sorted((tmp_path / "resumed" / "shards").glob("*.done.json"))
    assert 1 <= len(done) < 6
    assert _run_driver(source, tmp_path / "resumed", 0).wait(timeout=600) == 0
    for name in ("per_text", "per_head", "examples"):
        whole = pq.read_table(tmp_path / "whole" / f"{name}.parquet")
        assert pq.read_table(tmp_path / "resumed" / f"{name}.parquet").equals(whole), name
    assert (tmp_path / "resumed" / "errors.jsonl").read_bytes() == (
        tmp_path / "whole" / "errors.jsonl"
    ).read_bytes()
    first, second = (json.loads((tmp_path / d / "run.json").read_text()) for d in ("whole", "resumed"))
    assert {k: v for k, v in first.items() if k not in ("name", "timings", "started", "finished")} == {
        k: v for k, v in second.items() if k not in ("name", "timings", "started", "finished")
    }


def test_two_threads_run_two_batches_at_once_with_one_threads_bits(
    finished, minilm: AttentionModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On two torch threads the local engine runs two batches at a time, each on one torch thread
    (mha._threads): the same kernels on the same batches as a one-thread run, so the same sums in the same
    order and equal bits, shards included; torch's own thread count is restored after."""
    source = finished[0]
    sections: list[int] = []
    in_order = local_engine.in_order

    def counted(function, items, threads):  # type: ignore[no-untyped-def]
        sections.append(threads)
        return in_order(function, items, threads)

    monkeypatch.setattr(local_engine, "in_order", counted)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            run(source, minilm, tmp_path / str(threads), batch=BATCH, shard_size=SHARD)
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    assert sections == [1, 2]
    one, two = tmp_path / "1", tmp_path / "2"
    for name in ("per_text", "per_head", "examples"):
        assert pq.read_table(two / f"{name}.parquet").equals(pq.read_table(one / f"{name}.parquet")), name
    names = sorted(p.name for p in shard_directory(one).iterdir())
    assert sorted(p.name for p in shard_directory(two).iterdir()) == names
    for name in names:
        assert (shard_directory(two) / name).read_bytes() == (shard_directory(one) / name).read_bytes()


def test_progress_counts_records_batch_by_batch(minilm: AttentionModel, tmp_path: Path) -> None:
    source = tmp_path / "c.txt"
    write_txt(source, texts(8))  # 10 records: shards of 5, batches of 3 then 2
    calls: list[tuple[int, int]] = []
    run(source, minilm, tmp_path / "out", batch=3, shard_size=5, progress=lambda *call: calls.append(call))
    assert calls == [(0, 10), (3, 10), (5, 10), (8, 10), (10, 10)]


def test_words_for_an_encoder_decoder_are_refused_before_any_file(
    seq2seq_checkpoints, tmp_path: Path
) -> None:
    source = tmp_path / "c.txt"
    write_txt(source, texts(2))
    with pytest.raises(ValueError, match="encoder-decoder"):
        run(source, str(seq2seq_checkpoints["t5"]), tmp_path / "out", words=True, device="cpu")
    assert not (tmp_path / "out").exists()
