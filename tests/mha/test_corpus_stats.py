"""The batched statistics (mha.analysis.batched) and CorpusWorker against head_stats on each text alone."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from checkpoints import build_checkpoint
from corpus_files import attend_as_the_worker
from tolerances import batched_stat, norm_share_stat

from mha import load_pretrained
from mha.analysis import (
    LABELS,
    SPECIAL_TOKENS,
    head_chance,
    head_labels,
    head_stats,
    merge_to_words,
    word_groups_from,
)
from mha.analysis.batched import STATS, BatchStats, batch_head_labels, batch_head_stats
from mha.analysis.detection import chance_scores, model_scores
from mha.analysis.norms import row_shares, weight_norm_map
from mha.analysis.stats import spelled_ids, token_masks
from mha.analysis.words import word_labels
from mha.corpus import CorpusWorker
from mha.corpus.worker import padded_groups
from mha.model import AttentionModel


def check_against_alone(batched: dict[str, torch.Tensor], alone: list[dict[str, torch.Tensor]], width: int):
    for row, stats in enumerate(alone):
        for stat in STATS:
            difference = (batched[stat][row].double() - stats[stat].double()).abs().max().item()
            assert difference <= batched_stat(stat, width), (row, stat, difference)


def check_labels(
    batched_labels: torch.Tensor,
    alone: list[dict[str, torch.Tensor]],
    chance: list[dict[str, torch.Tensor]] | None = None,
) -> None:
    for row, stats in enumerate(alone):
        labels = head_labels(stats, chance=None if chance is None else chance[row])
        assert [[LABELS[i] for i in layer] for layer in batched_labels[row].tolist()] == labels


def random_maps(lengths: list[int], *, layers: int, heads: int, causal: bool, seed: int) -> torch.Tensor:
    """[B, L, H, T, T] sharp random row distributions, padded keys 0 and padded rows filler (uniform)."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    maps = torch.full((len(lengths), layers, heads, width, width), 1.0 / width)
    for b, n in enumerate(lengths):
        logits = 4 * torch.randn(layers, heads, n, n, generator=generator)
        if causal:
            logits = logits.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        maps[b, :, :, :n, :] = 0
        maps[b, :, :, :n, :n] = logits.softmax(-1)
    return maps


VOCABULARY = ["[CLS]", "the", ",", "cat", "##s", ".", "[SEP]", "Ġdog", ";", "sat"]


@pytest.mark.parametrize("causal", [False, True])
def test_batched_stats_equal_head_stats_on_each_text(causal: bool) -> None:
    lengths = [1, 2, 5, 17, 9]
    maps = random_maps(lengths, layers=2, heads=3, causal=causal, seed=1)
    width = max(lengths)
    tokens = [[VOCABULARY[(b + i) % len(VOCABULARY)] for i in range(n)] for b, n in enumerate(lengths)]
    special = torch.zeros(len(lengths), width, dtype=torch.bool)
    punctuation = torch.zeros(len(lengths), width, dtype=torch.bool)
    alone = []
    for b, (n, spelled) in enumerate(zip(lengths, tokens, strict=True)):
        marks = [t in SPECIAL_TOKENS for t in spelled]
        s, p = token_masks(spelled, marks)
        special[b, :n], punctuation[b, :n] = torch.tensor(s), torch.tensor(p)
        alone.append(head_stats(maps[b, :, :, :n, :n], spelled, special=marks, causal=causal))
    batched = batch_head_stats(maps, lengths, special=special, punctuation=punctuation, causal=causal)
    assert all(value.shape == (len(lengths), 2, 3) for value in batched.values())
    check_against_alone(batched, alone, width)
    check_labels(batch_head_labels(batched), alone)


@pytest.mark.parametrize("causal", [False, True])
def test_batched_labels_give_induction_as_head_labels_with_each_texts_chance(causal: bool) -> None:
    """The induction rule of batch_head_labels (the corpus job's labels) against head_labels with
    head_chance on each text alone: a head that copies (all of each row's weight on the key after an
    earlier copy) is induction where the text repeats, a head that reads uniformly is not (its score is
    its chance), and a text with no repeat (score absent, NaN) never is."""
    texts = [
        ["[CLS]", "the", "cat", "sat", "the", "cat", "sat"],
        ["[CLS]", "Ġdog", ",", "Ġdog", ","],
        ["[CLS]", "cat", "sat", "."],
    ]
    lengths, width = [len(t) for t in texts], max(len(t) for t in texts)
    maps = random_maps(lengths, layers=2, heads=3, causal=causal, seed=3)
    spelled = torch.full((len(texts), width), -1, dtype=torch.long)
    alone, chance = [], []
    for b, tokens in enumerate(texts):
        n, ids = len(tokens), spelled_ids(tokens)
        spelled[b, :n] = ids
        for i in range(n):  # layer 0: head 0 copies (induction keys), head 1 reads uniformly
            pattern = [j + 1 for j in range(i - 1) if ids[j] == ids[i] and j + 1 < i]
            if pattern:
                maps[b, 0, 0, i, :] = 0
                maps[b, 0, 0, i, pattern] = 1 / len(pattern)
            seen = i + 1 if causal else n
            maps[b, 0, 1, i, :] = 0
            maps[b, 0, 1, i, :seen] = 1 / seen
        marks = [t in SPECIAL_TOKENS for t in tokens]
        alone.append(head_stats(maps[b, :, :, :n, :n], tokens, special=marks, causal=causal))
        chance.append(head_chance(tokens, causal=causal))
    special = torch.zeros(len(texts), width, dtype=torch.bool)
    punctuation = torch.zeros(len(texts), width, dtype=torch.bool)
    for b, tokens in enumerate(texts):
        s, p = token_masks(tokens, [t in SPECIAL_TOKENS for t in tokens])
        special[b, : len(tokens)], punctuation[b, : len(tokens)] = torch.tensor(s), torch.tensor(p)
    batched = batch_head_stats(maps, lengths, special=special, punctuation=punctuation, causal=causal)
    batched["induction"] = model_scores(maps, spelled, keys=spelled >= 0)["induction"]
    visible = torch.ones(width, width, dtype=torch.bool)
    texts_chance = chance_scores(
        visible.tril() if causal else visible, spelled, kinds=("induction",), keys=spelled >= 0
    )
    labels = batch_head_labels(batched, chance=texts_chance)
    check_labels(labels, alone, chance)
    induction = LABELS.index("induction")
    assert labels[0, 0, 0] == labels[1, 0, 0] == induction  # the copying head, where the text repeats
    assert (labels[:, 0, 1] != induction).all() and (labels[2] != induction).all()
    assert (batch_head_labels(batched) != induction).all()  # without the texts' chance: no induction rule


def test_batched_stats_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk smaller than one text's maps gives the same numbers (the chunking is only about memory),
    and so do the maps a layer at a time and layer-major, as the corpus worker takes them from
    forward_layers."""
    from mha.analysis import batched as module

    lengths = [4, 7, 3]
    maps = random_maps(lengths, layers=2, heads=2, causal=False, seed=2)
    masks = {
        "special": torch.zeros(3, 7, dtype=torch.bool),
        "punctuation": torch.zeros(3, 7, dtype=torch.bool),
    }
    whole = batch_head_stats(maps, lengths, **masks, causal=False)
    layers = [batch_head_stats(maps[:, [k]], lengths, **masks, causal=False) for k in range(2)]
    prepared = BatchStats(lengths, **masks, causal=False, batch=3, width=7, device=maps.device)
    layer_major = prepared(maps.transpose(0, 1).contiguous(), layer_major=True)  # as the forward writes
    for stat in STATS:
        assert torch.equal(torch.cat([layer[stat] for layer in layers], dim=1), whole[stat]), stat
        assert torch.equal(layer_major[stat], whole[stat]), stat
    with pytest.raises(ValueError, match=r"shaped \[L, B, H, T, T\] with B 3 and T 7, got \(3, 2, 2, 7, 7\)"):
        prepared(maps, layer_major=True)
    monkeypatch.setattr(module, "_CHUNK_ELEMENTS", 49)  # one 7x7 map per chunk
    chunked = batch_head_stats(maps, lengths, **masks, causal=False)
    for stat in STATS:
        torch.testing.assert_close(chunked[stat], whole[stat], rtol=0, atol=0)


def test_batched_stats_refuse_bad_shapes() -> None:
    maps = random_maps([3, 2], layers=1, heads=1, causal=False, seed=3)
    masks = {
        "special": torch.zeros(2, 3, dtype=torch.bool),
        "punctuation": torch.zeros(2, 3, dtype=torch.bool),
    }
    with pytest.raises(ValueError, match="lengths"):
        batch_head_stats(maps, [3, 4], **masks, causal=False)
    with pytest.raises(ValueError, match=r"\[B, L, H, T, T\]"):
        batch_head_stats(maps[0], [3], **masks, causal=False)
    with pytest.raises(ValueError, match="special"):
        batch_head_stats(
            maps, [3, 2], special=masks["special"][:1], punctuation=masks["punctuation"], causal=False
        )


TEXTS = [
    ("The cat sat on the mat.", None),
    ("Attention heads look at tokens; some look at the previous token, some at punctuation!", None),
    ("Hi.", "A pair, with its own words."),
    ("Ünïcödé: naïve café, Straße and numbers 12345.", None),
]


@pytest.fixture(scope="module")
def bart(seq2seq_checkpoints: dict[str, Path]) -> AttentionModel:
    return load_pretrained(seq2seq_checkpoints["bart"], device="cpu")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> AttentionModel:
    directory = build_checkpoint("llama", tmp_path_factory.mktemp("llama") / "llama")
    return load_pretrained(directory, device="cpu")


def worker_rows(worker: CorpusWorker, texts: list[tuple[str, str | None]]) -> dict[str, list]:
    lines = list(range(1, len(texts) + 1))
    batch = {
        "line": lines,
        "id": [str(x) for x in lines],
        "text": [t for t, _ in texts],
        "text_pair": [p for _, p in texts],
    }
    return worker(batch).to_pydict()


@pytest.mark.parametrize("which", ["minilm", "llama"])
def test_worker_equals_head_stats_per_text(which: str, request: pytest.FixtureRequest) -> None:
    """The worker's rows against head_stats (and head_labels) on each text of the same padded forward,
    causal as the service passes it (the model's)."""
    model = request.getfixturevalue(which)
    rows = worker_rows(CorpusWorker(model), TEXTS)
    answers = attend_as_the_worker(model, TEXTS)
    results = [result for result, _ in answers]
    for row, (result, width) in enumerate(answers):
        stats = head_stats(result.attentions, result.tokens, special=result.special, causal=model.info.causal)
        batched = {stat: torch.tensor(rows[stat][row]).reshape(1, model.info.layers, -1) for stat in STATS}
        check_against_alone(batched, [stats], width)
        chance = head_chance(result.tokens, causal=model.info.causal)  # the worker's labels: with induction
        check_labels(torch.tensor(rows["label"][row]).reshape(1, model.info.layers, -1), [stats], [chance])
    assert rows["n_tokens"] == [r.n for r in results]
    assert rows["error"] == [None] * len(TEXTS)


def test_worker_words_equal_head_stats_on_word_maps(minilm: AttentionModel) -> None:
    """--words: the statistics of each text's word map, merged as the service's words view merges it."""
    rows = worker_rows(CorpusWorker(minilm, words=True), TEXTS)
    for row, (r, width) in enumerate(attend_as_the_worker(minilm, TEXTS)):
        groups = word_groups_from(r.word_ids, r.segments, r.special).groups
        words = word_labels(r.tokens, groups, offsets=r.offsets, segments=r.segments, texts=r.texts)
        special = [r.special[g[0]] for g in groups]
        stats = head_stats(merge_to_words(r.attentions, groups), words, special=special, causal=False)
        batched = {stat: torch.tensor(rows[stat][row]).reshape(1, 6, 12) for stat in STATS}
        # A word map is padded to the batch's most words, at most its padded token width.
        check_against_alone(batched, [stats], width)


@pytest.mark.parametrize(
    ("which", "words"), [("minilm", False), ("llama", False), ("bart", False), ("minilm", True)]
)
def test_worker_by_norm_equals_head_stats_of_norm_shares_per_text(
    which: str, words: bool, request: pytest.FixtureRequest
) -> None:
    """weighting "norm": each text's statistics are head_stats of its weight × value norm shares, from
    attend(norms=True) on that text (row_shares of weight_norm_map, as the service's "norm" view; words
    merged from those token shares, as the service merges them), and not the weights'."""
    model = request.getfixturevalue(which)
    rows = worker_rows(CorpusWorker(model, words=words, weighting="norm"), TEXTS)
    by_weight = worker_rows(CorpusWorker(model, words=words), TEXTS)
    layers, heads = model.info.layers, model.info.heads
    moved = 0.0
    for row, (result, width) in enumerate(attend_as_the_worker(model, TEXTS, norms=True)):
        shares, _ = row_shares(weight_norm_map(result.attentions, result.norms))
        tokens, special = result.tokens, result.special
        if words:
            groups = word_groups_from(result.word_ids, result.segments, result.special).groups
            shares = merge_to_words(shares, groups)
            tokens = word_labels(
                tokens, groups, offsets=result.offsets, segments=result.segments, texts=result.texts
            )
            special = [result.special[g[0]] for g in groups]
        stats = head_stats(shares, tokens, special=special, causal=model.info.causal)
        for stat in STATS:
            got = torch.tensor(rows[stat][row], dtype=torch.float64).reshape(layers, heads)
            difference = (got - stats[stat].double()).abs().max().item()
            assert difference <= norm_share_stat(stat, width), (row, stat, difference)
            change = torch.tensor(by_weight[stat][row]) - torch.tensor(rows[stat][row])
            moved = max(moved, change.abs().max().item())
        chance = head_chance(tokens, causal=model.info.causal)  # of the words, in a words run
        check_labels(torch.tensor(rows["label"][row]).reshape(1, layers, -1), [stats], [chance])
    # The shares are not the weights: some statistic moved far beyond any tolerance above (~1e-5).
    assert moved > 1e-2


def test_worker_refuses_an_unknown_weighting(minilm: AttentionModel) -> None:
    with pytest.raises(ValueError, match=r"weighting \('size'\) must be one of weight, norm"):
        CorpusWorker(minilm, weighting="size")


def test_worker_bad_rows_and_truncation(minilm: AttentionModel) -> None:
    """A record the reader flagged passes through as a bad row; one the tokenizer cannot take becomes one
    with the model's message; a text over max_tokens is cut and flagged."""
    worker = CorpusWorker(minilm, max_tokens=8)
    batch = {
        "line": [1, 2, 3, 4],
        "id": ["a", "b", "c", "d"],
        "text": ["short.", None, "\u200b", "one two three four five six seven eight nine ten"],
        "text_pair": [None, None, None, None],
        "error": [None, "invalid JSON", None, None],
    }
    rows = worker(batch).to_pydict()
    assert rows["error"][0] is None and rows["error"][1] == "invalid JSON"
    assert rows["error"][2] is not None and "token" in rows["error"][2]
    assert rows["n_tokens"] == [4, 0, 0, 8]
    assert rows["truncated"] == [False, False, False, True]
    assert rows["text"][1] is None and math.isnan(rows["entropy"][1][0])


def test_worker_refuses_words_for_an_encoder_decoder(seq2seq_checkpoints: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="encoder-decoder"):
        CorpusWorker(str(seq2seq_checkpoints["bart"]), words=True, device="cpu")


def test_padded_groups_sort_by_length_and_bound_the_padding() -> None:
    # 5, 5, 6: 3 x 6 = 18 padded for 16 tokens (within 15 %); 50 would pad them to 200.
    assert padded_groups([5, 50, 6, 52, 5]) == [[0, 4, 2], [1, 3]]
    assert padded_groups([40] * 32) == [list(range(32))]  # alike: one forward
    assert padded_groups([]) == []


# Characters MiniLM's vocabulary lacks: each word holding one becomes [UNK].
UNKNOWN_TEXTS = [("The snowman ☃ waved.", None), ("Emoji 😀 and 鿿 are unknown here.", "So is ☃.")]


@pytest.mark.parametrize("words", [False, True], ids=["tokens", "words"])
def test_worker_special_is_cls_plus_sep_with_unknown_words(minilm: AttentionModel, words: bool) -> None:
    """The corpus's `special` is Clark et al.'s attention to [CLS] plus [SEP], by hand on each text's map
    (merged to words as the service merges them, with --words): an [UNK] stands for a word, not a sink."""
    rows = worker_rows(CorpusWorker(minilm, words=words), UNKNOWN_TEXTS)
    for row, (r, width) in enumerate(attend_as_the_worker(minilm, UNKNOWN_TEXTS)):
        assert "[UNK]" in r.tokens  # the premise
        groups = [[i] for i in range(r.n)]
        if words:  # [UNK] has its word id: merged into its word
            groups = word_groups_from(r.word_ids, r.segments, r.special).groups
        maps = merge_to_words(r.attentions, groups)
        sinks = [k for k, group in enumerate(groups) if r.tokens[group[0]] in ("[CLS]", "[SEP]")]
        clark = maps[..., sinks].double().sum(-1).mean(-1)  # [L, H]
        got = torch.tensor(rows["special"][row], dtype=torch.float64).reshape(clark.shape)
        assert (got - clark).abs().max().item() <= batched_stat("special", width)
