"""/v1/messages and /v1/messages/count_tokens through the official `anthropic` client, the Serve Sampler and vLLM's
Anthropic serving layer: a base model and a trained checkpoint, streamed and not, checked against the Tinker SDK's
sampling of the same rendered conversation."""

from __future__ import annotations

import uuid

import anthropic
import pytest
import tinker
from tinker import types

from app.storage.paths import parse_tinker_path
from tests.integration.conftest import BASE_MODEL
from tests.integration.helpers import new_client, train_steps

KEY = "tml-integration-tests"  # the service_client fixture's user
TRAINED_TEXT = "The cat sat on the mat near the door."
MAX_TOKENS = 8
MESSAGES: list[anthropic.types.MessageParam] = [{"role": "user", "content": "The cat sat"}]
GREEDY = {"temperature": 0}  # the client (2.x) takes no sampling arguments of its own: they go as extra body fields


@pytest.fixture(scope="module")
def client(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def trained(service_client: tinker.ServiceClient) -> tuple[str, tinker.SamplingClient, list[int]]:
    """(sampler checkpoint path, an SDK sampler on it, MESSAGES rendered by the chat template): trained hard on one
    sentence, so its greedy reply differs from the base model's."""
    tc = new_client(service_client, seed=29)
    tokenizer = tc.get_tokenizer()
    ids = tokenizer.encode(TRAINED_TEXT)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )
    train_steps(tc, [datum], steps=6, lr=5e-2)
    path = tc.save_weights_for_sampler("anthropic").result().path
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    rendered = tokenizer.encode(text, add_special_tokens=False)  # as vLLM's chat renders it
    return path, service_client.create_sampling_client(model_path=path).result(), rendered


def test_greedy_replies_equal_sdk_samples_of_the_rendered_conversation(client, service_client, trained):
    """Base and checkpoint: the reply is the SDK's greedy sample of the chat template's tokens, and count_tokens
    counts those tokens."""
    path, sampler, rendered = trained
    tokenizer = sampler.get_tokenizer()
    params = types.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    base_sampler = service_client.create_sampling_client(base_model=BASE_MODEL).result()
    replies = []
    for model, sdk in ((path, sampler), (BASE_MODEL, base_sampler)):
        reply = client.messages.create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, extra_body=GREEDY)
        expected = sdk.sample(types.ModelInput.from_ints(rendered), 1, params).result().sequences[0].tokens
        assert reply.model == model and reply.role == "assistant" and reply.type == "message"
        assert reply.stop_reason in ("end_turn", "max_tokens")
        assert reply.usage.input_tokens == len(rendered) and reply.usage.output_tokens == len(expected)
        assert [block.type for block in reply.content] == ["text"]
        assert reply.content[0].text == tokenizer.decode(expected, skip_special_tokens=True)  # type: ignore[union-attr]
        replies.append(reply.content[0].text)  # type: ignore[union-attr]
        counted = client.messages.count_tokens(model=model, messages=MESSAGES)
        assert counted.input_tokens == len(rendered)
    assert replies[0] != replies[1]


def test_a_streamed_reply_comes_in_order_and_equals_the_whole(client, trained):
    path, _, _ = trained
    whole = client.messages.create(model=path, messages=MESSAGES, max_tokens=MAX_TOKENS, extra_body=GREEDY)
    events = list(
        client.messages.create(model=path, messages=MESSAGES, max_tokens=MAX_TOKENS, stream=True, extra_body=GREEDY)
    )
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
    blocks = kinds[1:-2]
    assert blocks[0] == "content_block_start" and blocks[-1] == "content_block_stop", kinds
    assert set(blocks[1:-1]) == {"content_block_delta"}, kinds
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert text == whole.content[0].text  # type: ignore[union-attr]
    delta = events[-2]
    assert delta.type == "message_delta" and delta.delta.stop_reason == whole.stop_reason


def test_bad_requests_answer_in_anthropics_error_shape(client):
    cases = [  # refused by the ingress's limits; by vLLM's Anthropic request model, in the Sampler
        ({"max_tokens": 10**6}, "limits.max_sample_tokens"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ]
    for fields, words in cases:
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(**{"model": BASE_MODEL, "messages": MESSAGES, "max_tokens": 2, **fields})
        body = caught.value.body
        assert isinstance(body, dict) and body["type"] == "error", body
        assert body["error"]["type"] == "invalid_request_error" and words in body["error"]["message"], body


def test_another_users_checkpoint_looks_missing(base_url, trained):
    path, _, _ = trained
    other = anthropic.Anthropic(base_url=base_url, api_key="tml-anthropic-someone-else", max_retries=0)
    model_id = parse_tinker_path(path).model_id
    missing_id = f"{uuid.uuid4().hex}:train:0"
    errors = []
    for model, shown_id in ((path, model_id), (path.replace(model_id, missing_id), missing_id)):
        with pytest.raises(anthropic.NotFoundError) as caught:
            other.messages.create(model=model, messages=MESSAGES, max_tokens=2)
        errors.append(str(caught.value.body).replace(shown_id, "<ID>"))
    assert errors[0] == errors[1] and "not_found_error" in errors[0]
