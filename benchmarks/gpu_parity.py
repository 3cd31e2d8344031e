"""benchmarks/gpu.py's parity section: every family we convert, in float32, float16 and bfloat16, each map's
largest error against our own float64 network beside transformers' eager model's (gpu.py's docstring).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from gpu_run import Row, Run, Skipped

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def our_network(directory: Path, device: torch.device, dtype: torch.dtype) -> tuple[Any, str]:
    """(our network for the checkpoint on `device` in `dtype`, a note): loaded as a user loads it, or, for
    a dtype the loader refuses on this device, our float32 network cast as the loader casts (float64: the
    reference; bfloat16 on the CPU); float16 where the loader refuses it is Skipped."""
    from mha import load_pretrained
    from mha.devices import resolve_dtype

    if dtype != torch.float64:
        try:
            resolve_dtype(dtype, device)
        except ValueError as refusal:
            if dtype == torch.float16:
                raise Skipped(f"float16 skipped: our loader refuses it here ({refusal})") from None
        else:
            return load_pretrained(directory, device=device, dtype=dtype).network, ""
    network = load_pretrained(directory, device=device).network.to(dtype)
    note = "" if dtype == torch.float64 else "our float32 network cast (the loader refuses it on the CPU)"
    return network, note


def their_maps(directory: Path, seq2seq: bool, inputs: dict[str, torch.Tensor], dtype: torch.dtype) -> list:
    """transformers' eager attention maps, its model loaded in `dtype` as its users load it."""
    from transformers import AutoModel, AutoModelForSeq2SeqLM

    loader = AutoModelForSeq2SeqLM if seq2seq else AutoModel
    model = loader.from_pretrained(str(directory), dtype=dtype, attn_implementation="eager")
    model = model.to(inputs["input_ids"].device).eval()
    with torch.no_grad():
        out = model(**inputs, output_attentions=True)
    kinds = ("encoder_attentions", "decoder_attentions", "cross_attentions") if seq2seq else ("attentions",)
    return [torch.stack(getattr(out, kind)) for kind in kinds]


def max_error(maps: list, reference: list[torch.Tensor]) -> float:
    return max((m.double() - r).abs().max().item() for m, r in zip(maps, reference, strict=True))


def parity(run: Run) -> None:
    from checkpoints import FAMILIES, build_checkpoint, network_maps, parity_inputs
    from seq2seq_checkpoints import SEQ2SEQ_FAMILIES, build_seq2seq_checkpoint

    seq2seq_families = (*SEQ2SEQ_FAMILIES, "mt5")
    skipped: set[str] = set()
    for family in (*FAMILIES, *seq2seq_families):
        seq2seq = family in seq2seq_families
        build = build_seq2seq_checkpoint if seq2seq else build_checkpoint
        directory = build(family, run.scratch / "parity" / family)
        inputs = parity_inputs(directory, seq2seq, run.device)
        reference = [
            m.double() for m in network_maps(our_network(directory, run.device, torch.float64)[0], inputs)
        ]
        for dtype in DTYPES:
            try:
                network, note = our_network(directory, run.device, dtype)
                ours = max_error(network_maps(network, inputs), reference)
                theirs = max_error(their_maps(directory, seq2seq, inputs, dtype), reference)
            except Skipped as why:
                skipped.add(str(why))
                continue
            except (RuntimeError, ValueError) as error:  # one family's failure costs its own row only
                run.add(
                    Row("parity", f"{family} {dtype_name(dtype)}", "-", "-", None, f"failed: {error}"[:200])
                )
                continue
            run.add(
                Row(
                    "parity",
                    f"{family} {dtype_name(dtype)}",
                    f"{ours:.2e}",
                    f"transformers {theirs:.2e}",
                    ours / theirs if theirs else None,
                    note,
                    {"ours": ours, "transformers": theirs},
                )
            )
    run.notes.extend(sorted(skipped))
