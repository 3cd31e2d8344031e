"""Gemma 3: what it adds to Gemma 2, each checked against transformers (the parity of its text model from a
checkpoint folder and from GGUF is in test_fidelity.py and test_gguf.py with every family's).

- each layer type's own rope: the local layers' base apart from the global layers' scaled one;
- the image-and-text checkpoint (model_type "gemma3", Gemma3ForConditionalGeneration, what Hugging Face
  holds for Gemma 3 4B and up): its text model read from under `model.language_model.`, the vision tower
  skipped.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from tolerances import FORWARD

from mha import load_pretrained
from mha.loading.convert.gemma3 import config_from_hf

# A vision tower as small as SigLIP builds: the image-and-text checkpoint needs one, the text never reads it
TINY_VISION = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
TEXT = "The cat sat on the mat and the dog sat on the log, every head of every layer."


def _transformers_attentions(directory: Path, model_class: str) -> torch.Tensor:
    import transformers as tf

    reference = getattr(tf, model_class).from_pretrained(str(directory), attn_implementation="eager").eval()
    ids = tf.AutoTokenizer.from_pretrained(str(directory))(TEXT, return_tensors="pt")
    with torch.no_grad():
        out = reference(**ids, output_attentions=True)
    return torch.stack(out.attentions)[:, 0]


def test_local_and_global_layers_rotate_by_their_own_ropes(tiny_checkpoints: dict[str, Path]) -> None:
    import transformers as tf

    config = config_from_hf(tf.AutoConfig.from_pretrained(str(tiny_checkpoints["gemma3"])))
    assert config.window_layers == (0, 2)
    assert config.rope is not None and config.local_rope is not None
    assert (config.rope.theta, config.rope.rope_type) == (1e6, "linear")
    assert (config.local_rope.theta, config.local_rope.rope_type) == (1e4, "default")

    model = load_pretrained(tiny_checkpoints["gemma3"], device="cpu")
    theirs = _transformers_attentions(tiny_checkpoints["gemma3"], "AutoModelForCausalLM")
    assert torch.allclose(torch.as_tensor(model.attend(TEXT).attentions), theirs, atol=FORWARD, rtol=0)
    # Not a test that passes whatever the local rope: with the global one everywhere, the first layer (a
    # local one, reading the embeddings as before) attends elsewhere.
    network = model.network
    network.config = dataclasses.replace(network.config, local_rope=None)
    wrong = torch.as_tensor(model.attend(TEXT).attentions)
    assert (wrong[0] - theirs[0]).abs().max() > 100 * FORWARD


def test_one_rope_for_every_layer_where_the_config_names_one(tiny_checkpoints: dict[str, Path]) -> None:
    import transformers as tf

    hf = tf.AutoConfig.from_pretrained(str(tiny_checkpoints["gemma3"]))
    same = {"rope_type": "default", "rope_theta": 10000.0}
    hf.rope_parameters = {"sliding_attention": dict(same), "full_attention": dict(same)}
    config = config_from_hf(hf)
    assert config.local_rope is None and config.rope is not None and config.rope.theta == 1e4


def test_the_image_and_text_checkpoint_loads_its_text_model(
    tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    import transformers as tf

    text_dir = tiny_checkpoints["gemma3"]
    vision = tf.SiglipVisionConfig(**TINY_VISION, image_size=32, patch_size=16)
    text_config = tf.AutoConfig.from_pretrained(str(text_dir))
    # Untied, as the text checkpoint is: a tied head would overwrite the embeddings on save
    both = tf.Gemma3ForConditionalGeneration(
        tf.Gemma3Config(
            text_config=text_config.to_dict(),
            vision_config=vision.to_dict(),
            mm_tokens_per_image=4,
            tie_word_embeddings=False,
        )
    )
    text_model = tf.AutoModelForCausalLM.from_pretrained(str(text_dir))
    # The text model's weights under the image-and-text model's names; its vision tower stays random.
    weights = {
        (f"model.language_model.{k.removeprefix('model.')}" if k.startswith("model.") else k): v
        for k, v in text_model.state_dict().items()
    }
    missing, unexpected = both.load_state_dict(weights, strict=False)
    assert not unexpected and all("vision" in k or "projector" in k for k in missing)
    directory = tmp_path / "gemma3-image-and-text"
    both.save_pretrained(directory)
    for tokenizer_file in text_dir.glob("*token*"):
        shutil.copy(tokenizer_file, directory / tokenizer_file.name)

    model = load_pretrained(directory, device="cpu")
    assert model.info.family == "gemma3" and model.info.layers == 3
    theirs = _transformers_attentions(directory, "Gemma3ForConditionalGeneration")
    assert torch.allclose(torch.as_tensor(model.attend(TEXT).attentions), theirs, atol=FORWARD, rtol=0)
    assert torch.allclose(
        torch.as_tensor(model.attend(TEXT).attentions),
        torch.as_tensor(load_pretrained(text_dir, device="cpu").attend(TEXT).attentions),
        atol=0,
        rtol=0,
    )


@pytest.mark.parametrize("model_type", ["gemma3", "gemma3_text"])
def test_both_model_types_name_the_gemma3_family(model_type: str) -> None:
    from mha.loading.convert import for_model_type

    assert for_model_type(model_type).family == "gemma3"
