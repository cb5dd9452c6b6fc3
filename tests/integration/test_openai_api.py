"""The OpenAI-compatible routes through the official `openai` client, the Serve Sampler and vLLM's OpenAI serving
layer: base model and trained checkpoint, streamed and not, checked against the Tinker SDK's own sampling."""

from __future__ import annotations

import json
import uuid

import httpx
import openai
import pytest
import tinker
from tinker import types

from app.storage.paths import parse_tinker_path
from tests.integration.conftest import BASE_MODEL
from tests.integration.helpers import new_client, train_steps

KEY = "tml-integration-tests"  # the service_client fixture's user
TRAINED_TEXT = "The cat sat on the mat near the door."
MAX_TOKENS = 8
EXACT = {"return_tokens_as_token_ids": True}  # vLLM's extension: logprobs tokens as "token_id:<id>"


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def trained(service_client: tinker.ServiceClient) -> tuple[str, tinker.SamplingClient, list[int]]:
    """(sampler checkpoint path, an SDK sampler on it, a prompt): trained hard on one sentence, so its greedy
    continuation of the sentence's start differs from the base model's."""
    tc = new_client(service_client, seed=23)
    ids = tc.get_tokenizer().encode(TRAINED_TEXT)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )
    train_steps(tc, [datum], steps=6, lr=5e-2)
    path = tc.save_weights_for_sampler("openai").result().path
    return path, service_client.create_sampling_client(model_path=path).result(), ids[:3]


def _token_ids(choice: openai.types.CompletionChoice) -> list[int]:
    assert choice.logprobs is not None and choice.logprobs.tokens is not None
    return [int(token.removeprefix("token_id:")) for token in choice.logprobs.tokens]


def _greedy(client: openai.OpenAI, model: str, prompt: list[int]) -> openai.types.Completion:
    return client.completions.create(
        model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, seed=0, logprobs=1, extra_body=EXACT
    )


def test_models_lists_base_models(client):
    models = client.models.list()
    assert BASE_MODEL in [m.id for m in models.data]


def test_checkpoint_greedy_equals_sdk_sample_and_differs_from_base(client, service_client, trained):
    path, sampler, prompt = trained
    params = types.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, seed=0)
    base_sampler = service_client.create_sampling_client(base_model=BASE_MODEL).result()
    for model, sdk in ((path, sampler), (BASE_MODEL, base_sampler)):
        completion = _greedy(client, model, prompt)
        assert completion.model == model
        expected = sdk.sample(types.ModelInput.from_ints(prompt), 1, params).result().sequences[0].tokens
        assert _token_ids(completion.choices[0]) == expected
    assert _token_ids(_greedy(client, path, prompt).choices[0]) != _token_ids(
        _greedy(client, BASE_MODEL, prompt).choices[0]
    )


def test_streamed_completion_equals_the_whole(client, trained):
    path, _, prompt = trained
    whole = client.completions.create(model=path, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0).choices[0]
    chunks = list(
        client.completions.create(model=path, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True)
    )
    assert len(chunks) > 1 and all(c.model == path for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.text


def _prompt_ending_mid_character(tokenizer) -> list[int]:
    """Token ids whose text ends in an incomplete character (what random or cut token prompts often do)."""
    for start in range(3, 2000):
        ids = [start, *range(start * 7 % 1900 + 3, start * 7 % 1900 + 8)]
        if len(tokenizer.decode(ids)) > 3 and tokenizer.decode(ids).endswith("\ufffd"):
            return ids
    raise AssertionError("no such prompt in the vocabulary")


def test_a_token_prompt_ending_mid_character_is_not_echoed(base_url, service_client):
    """A prompt given as token ids whose text ends in an incomplete character: the completion's text (streamed or
    not) is the generated tokens' text alone, not the prompt's in front of it (`echo` unset). A logit bias makes the
    random base write "a"s, as in the report (its own greedy tokens are often bytes of no whole character)."""
    tokenizer = new_client(service_client, seed=24).get_tokenizer()
    prompt = _prompt_ending_mid_character(tokenizer)
    (letter,) = tokenizer.encode("a")
    body = {
        "model": BASE_MODEL,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "logit_bias": {str(letter): 100},
        "return_token_ids": True,
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    answer = httpx.post(f"{base_url}/v1/completions", json=body, headers=headers, timeout=120).json()["choices"][0]
    assert answer["token_ids"] == [letter] * MAX_TOKENS
    assert answer["text"] == "a" * MAX_TOKENS
    streamed = httpx.post(f"{base_url}/v1/completions", json={**body, "stream": True}, headers=headers, timeout=120)
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "a" * MAX_TOKENS


def test_chat_uses_the_template_streamed_or_not(client, trained):
    path, _, _ = trained
    messages = [{"role": "user", "content": "The cat sat"}]
    for model in (BASE_MODEL, path):
        whole = client.chat.completions.create(
            model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0, logprobs=True, top_logprobs=2
        )
        assert whole.model == model and whole.usage is not None and whole.usage.prompt_tokens > 5  # the template
        choice = whole.choices[0]
        assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
        assert choice.logprobs is not None and all(len(t.top_logprobs) == 2 for t in choice.logprobs.content or [])
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == choice.message.content


def test_sampling_options(client, trained):
    path, _, prompt = trained
    options = {"model": path, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 1.0, "top_p": 0.9}
    first = client.completions.create(**options, n=2, seed=7)
    assert len(first.choices) == 2
    assert [c.text for c in client.completions.create(**options, n=2, seed=7).choices] == [
        c.text for c in first.choices
    ]
    stopped = client.completions.create(**{**options, "temperature": 0}, stop=[first.choices[0].text[:1] or "x"])
    assert stopped.choices[0].finish_reason in ("stop", "length")
    text = client.completions.create(model=BASE_MODEL, prompt="The cat", max_tokens=3, temperature=0)
    assert text.usage is not None and text.usage.completion_tokens <= 3


def test_another_users_checkpoint_looks_missing(base_url, trained):
    path, _, _ = trained
    other = openai.OpenAI(base_url=f"{base_url}/v1", api_key="tml-openai-someone-else", max_retries=0)
    model_id = parse_tinker_path(path).model_id
    missing = path.replace(model_id, f"{uuid.uuid4().hex}:train:0")
    errors = []
    for model in (path, missing):
        with pytest.raises(openai.NotFoundError) as caught:
            other.completions.create(model=model, prompt=[1, 2, 3], max_tokens=2)
        errors.append((caught.value.param, caught.value.message.replace(model, "<M>").replace(model_id, "<ID>")))
    missing_id = parse_tinker_path(missing).model_id
    assert errors[0] == (errors[1][0], errors[1][1].replace(missing_id, "<ID>")) and errors[0][0] == "model"


def test_bad_fields_are_4xx_naming_them(client, base_url):
    cases = [
        ({"model": BASE_MODEL, "max_tokens": 10**6}, openai.BadRequestError, "max_tokens"),
        ({"model": BASE_MODEL, "n": 10**4}, openai.BadRequestError, "n"),
        ({"model": "no/such-model"}, openai.NotFoundError, "model"),
        ({"model": BASE_MODEL, "temperature": -1.0}, openai.BadRequestError, "temperature"),  # vLLM's own check
    ]
    for fields, error, field in cases:
        with pytest.raises(error) as caught:
            client.completions.create(**{"prompt": [1, 2, 3], "max_tokens": 2, **fields})
        assert field in caught.value.message, caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=BASE_MODEL, messages=[], max_completion_tokens=10**6)
    assert caught.value.param == "max_completion_tokens"
    unauthenticated = httpx.post(f"{base_url}/v1/completions", json={"model": BASE_MODEL, "prompt": "x"})
    assert unauthenticated.status_code == 401 and "Bearer" in unauthenticated.json()["error"]["message"]
