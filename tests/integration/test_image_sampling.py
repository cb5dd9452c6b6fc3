"""Images in sampling through the whole app (the session's families app, conftest's `families_on_postgres`: its
Qwen3.5-MoE base is a tiny vision-language preset): a LoRA trained on image datums is sampled with an image in the
prompt and vLLM gives its own tokens, and compute_logprobs the prompt's, the trainer's logprobs; the official `openai`
client sends an image as a data: URL to the base and to the checkpoint (the cookbook's vlm_classifier evaluator
samples with images in test_vlm_classifier); an image_asset_pointer to a file in the app's asset root
is scored as the ImageChunk of its bytes."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import tinker
from PIL import Image
from tinker import types

from tests.integration.conftest import FAMILY_BASES
from tests.integration.test_families import SAMPLER_ATOL

VLM = FAMILY_BASES["qwen3_5_moe"]
TEXT_ONLY = FAMILY_BASES["qwen3"]
KEY = "tml-image-sampling"
IMAGE_TOKENS = 4  # a 48x48 image on the tiny presets' processor (resized to 64x64: 2x2 merged patches)


def png(label: int, seed: int) -> bytes:
    """A noisy 48x48 image of colour `label` (0: red, 1: blue)."""
    colour = ((220, 30, 30), (20, 40, 230))[label]
    pixels = np.clip(np.array(colour) + np.random.default_rng(seed).normal(0, 20, (48, 48, 3)), 0, 255)
    out = io.BytesIO()
    Image.fromarray(pixels.astype("uint8")).save(out, "PNG")
    return out.getvalue()


class ImagePrompt:
    """Text, one image between the vision markers, text: as a ModelInput, and as the datum whose targets are its
    next tokens (the image's positions unweighted)."""

    def __init__(self, tokenizer, image: bytes, before: str, after: list[int]) -> None:  # type: ignore[no-untyped-def]
        start, end, self.pad = tokenizer.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"])
        self.prefix = [*tokenizer.encode(before), start]
        self.image = types.ImageChunk(data=image, format="png", expected_tokens=IMAGE_TOKENS)
        self.suffix = [end, *after]

    def model_input(self, suffix: list[int] | None = None) -> types.ModelInput:
        return types.ModelInput(
            chunks=[
                types.EncodedTextChunk(tokens=self.prefix),
                self.image,
                types.EncodedTextChunk(tokens=self.suffix if suffix is None else suffix),
            ]
        )

    def datum(self, extra: list[int] = ()) -> types.Datum:  # type: ignore[assignment]
        """Next-token targets of the prompt followed by `extra`, weighted after the image."""
        sequence = [*self.prefix, *[self.pad] * IMAGE_TOKENS, *self.suffix, *extra]
        image_end = len(self.prefix) + IMAGE_TOKENS
        weights = [float(i + 1 >= image_end) for i in range(len(sequence) - 1)]
        return types.Datum(
            model_input=self.model_input([*self.suffix, *extra][:-1]),
            loss_fn_inputs={"target_tokens": sequence[1:], "weights": weights},
        )


@pytest.fixture(scope="module")
def client(families_on_postgres: str, base_url: str) -> Iterator[tinker.ServiceClient]:
    service = tinker.ServiceClient(base_url=base_url, api_key=KEY)
    yield service
    service.close("success").result()


@pytest.fixture(scope="module")
def trained(client: tinker.ServiceClient) -> tuple[tinker.TrainingClient, tinker.SamplingClient, str]:
    """A LoRA on the VLM base, two steps on image datums; its sampling client and checkpoint path."""
    tc = client.create_lora_training_client(VLM, rank=8, seed=5).result()
    tokenizer = tc.get_tokenizer()
    data = [
        ImagePrompt(tokenizer, png(label, seed=label), "Look:", tokenizer.encode(f" a {name} shape")).datum()
        for label, name in enumerate(("red", "blue"))
    ]
    for _ in range(2):
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    path = tc.save_weights_for_sampler("images").result().path
    return tc, tc.create_sampling_client(path).result(), path


def test_the_sampler_agrees_with_the_trainer_on_an_image_prompt(
    trained: tuple[tinker.TrainingClient, tinker.SamplingClient, str],
) -> None:
    tc, sampler, _ = trained
    tokenizer = tc.get_tokenizer()
    prompt = ImagePrompt(tokenizer, png(1, seed=7), "Look:", tokenizer.encode(" The subject is"))
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    (sequence,) = sampler.sample(prompt.model_input(), 1, params).result().sequences
    forward = tc.forward([prompt.datum(sequence.tokens)], "cross_entropy").result()
    expected = forward.loss_fn_outputs[0]["logprobs"].to_numpy()
    difference = np.abs(np.asarray(sequence.logprobs) - expected[-len(sequence.tokens) :]).max()
    scored = sampler.compute_logprobs(prompt.model_input()).result()  # the prompt's, after its first token
    prompt_expected = tc.forward([prompt.datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    prompt_difference = np.abs(np.asarray(scored[1:], dtype=float) - prompt_expected.to_numpy()).max()
    print(f"sampler vs trainer on an image prompt: sampled {difference:.1e}, prompt {prompt_difference:.1e}")
    np.testing.assert_allclose(sequence.logprobs, expected[-len(sequence.tokens) :], atol=SAMPLER_ATOL)
    assert scored[0] is None and len(scored) == prompt.model_input().length
    np.testing.assert_allclose(np.asarray(scored[1:], dtype=float), prompt_expected.to_numpy(), atol=SAMPLER_ATOL)


def test_a_pointer_chunk_is_scored_as_the_image_chunk_of_its_file(
    client: tinker.ServiceClient, image_asset_root: Path
) -> None:
    """compute_logprobs of a prompt whose image is an image_asset_pointer to a file in the app's asset root equals
    that of the same prompt with the file's bytes in an ImageChunk."""
    image = png(0, seed=11)
    (image_asset_root / "red.png").write_bytes(image)
    sampler = client.create_sampling_client(base_model=VLM).result()
    prompt = ImagePrompt(sampler.get_tokenizer(), image, "Look:", [])
    inline = prompt.model_input()
    pointer = types.ImageAssetPointerChunk(
        location=f"file://{image_asset_root}/red.png", format="png", expected_tokens=IMAGE_TOKENS
    )
    pointed = types.ModelInput(chunks=[inline.chunks[0], pointer, inline.chunks[2]])
    expected, got = (sampler.compute_logprobs(m).result() for m in (inline, pointed))
    assert got[0] is None and len(got) == len(expected) == inline.length
    difference = np.abs(np.asarray(got[1:], dtype=float) - np.asarray(expected[1:], dtype=float)).max()
    print(f"pointer vs image chunk, prompt logprobs: {difference:.1e}")
    assert difference <= 1e-6


def _chat(model: str, url: str | None) -> dict:
    content: list[dict] = [{"type": "text", "text": "What is in the picture?"}]
    if url is not None:
        content.append({"type": "image_url", "image_url": {"url": url}})
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0}


def test_the_openai_client_sends_an_image_to_a_vlm_and_its_checkpoint(
    trained: tuple[tinker.TrainingClient, tinker.SamplingClient, str], base_url: str
) -> None:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0, timeout=120)
    url = "data:image/png;base64," + base64.b64encode(png(0, seed=9)).decode()
    text = client.chat.completions.create(**_chat(VLM, None))
    for model in (VLM, trained[2]):
        answer = client.chat.completions.create(**_chat(model, url))
        assert answer.choices[0].message.content is not None and answer.model == model
        assert answer.usage is not None and text.usage is not None
        # the image's vision tokens and its start/end markers (vLLM puts them before the text, with a newline, where
        # the template takes text only, as the tiny presets' does)
        assert answer.usage.prompt_tokens - text.usage.prompt_tokens in (IMAGE_TOKENS + 2, IMAGE_TOKENS + 3)
    refusals = [
        (_chat(TEXT_ONLY, url), "messages[0].content[1]", "text-only"),
        (_chat(VLM, "https://example.com/cat.png"), "messages[0].content[1].image_url.url", "fetches nothing"),
    ]
    for body, param, said in refusals:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(**body)
        assert caught.value.body["param"] == param and said in caught.value.body["message"]  # type: ignore[index]
