"""A conversation as a language model reads it: its messages rendered by the tokenizer's own chat
template (``apply_chat_template``), tokenized, and each token's role and whether an assistant
wrote it (the loss mask that draft-model and SFT trainers use).

    messages = messages_of(row["messages"])        # or ShareGPT's [{from, value}]
    turns = render(tokenizer, messages)             # ids, loss_mask, role, how the mask was found

The loss mask is the template's own where it marks assistant text (``{% generation %}``:
transformers' ``return_assistant_tokens_mask``); elsewhere it is found by rendering each prefix
of the conversation, as the trainers do: an assistant turn's tokens lie between the render of
the turns before it with the generation prompt and the render that includes it. A token's role
is the role of the message whose render holds its first character (a message's render begins
with its template's header: ``<|im_start|>user``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from probe.file.format import ROLE, VALUE_NAMES

__all__ = ["ROLES", "Turns", "messages_of", "with_system", "render", "has_marks"]

ROLES = VALUE_NAMES[ROLE]  # /role's values, by code (its attr values)
_SHAREGPT = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
             "system": "system", "tool": "tool"}
_MARKS = re.compile(r"\{%-?\s*generation\s*-?%\}")
MARKS, PREFIXES = "the template's generation marks", "the renders of each prefix"


@dataclass(frozen=True)
class Turns:
    """A rendered conversation: its token ids, the assistant's tokens (``loss_mask``), each
    token's role (a code of ``ROLES``), and how the mask was found (``MARKS``, ``PREFIXES``)."""

    ids: np.ndarray  # (T,) int64
    loss_mask: np.ndarray  # (T,) bool
    role: np.ndarray  # (T,) int8
    way: str


def messages_of(conversation) -> list[dict]:
    """``[{role, content}]`` from either common shape: the same, or ShareGPT's ``[{from,
    value}]`` (human, gpt, system).

    Raises:
        ValueError: not a list of messages, a role that is not one of ``ROLES`` (or
            ShareGPT's), no assistant turn.
    """
    if not isinstance(conversation, (list, tuple)) or not conversation:
        raise ValueError(f"it is {type(conversation).__name__}, not a list of messages")
    messages = []
    for n, message in enumerate(conversation):
        if not isinstance(message, dict):
            raise ValueError(f"its message {n} is {type(message).__name__}, not a mapping")
        if "from" in message and "role" not in message:  # ShareGPT
            role = _SHAREGPT.get(str(message["from"]))
            said, content = message["from"], message.get("value")
        else:
            role = str(message.get("role"))
            said, content = role, message.get("content")
            role = role if role in ROLES else None
        if role is None:
            raise ValueError(f"its message {n} has role {said!r}, not one of "
                             f"{', '.join(ROLES)} (or ShareGPT's human, gpt)")
        if not isinstance(content, str):
            raise ValueError(f"its message {n} has content {content!r}, not text")
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("it has no assistant turn")
    return messages


def with_system(messages: list[dict], prompt: str | None) -> list[dict]:
    """``messages`` with ``prompt`` as their system turn (added first, or replacing theirs)."""
    if prompt is None:
        return messages
    rest = messages[1:] if messages[0]["role"] == "system" else messages
    return [{"role": "system", "content": str(prompt)}, *rest]


def has_marks(template: str) -> bool:
    """Whether a chat template marks the assistant's text (``{% generation %}``)."""
    return bool(_MARKS.search(template))


def render(tokenizer, messages: list[dict], template: str | None = None,
           prompt: bool = False) -> Turns:
    """The conversation through the chat template (the tokenizer's, or ``template``); with
    ``prompt``, followed by the generation prompt (the assistant's header, which is the
    assistant's role, not its text: outside the loss mask).

    Raises:
        ValueError: the template fails on it, or renders a prefix of it as no prefix of the
            whole (a mask cannot be found that way; give it generation marks).
    """
    text = _rendered(tokenizer, messages, template, prompt)
    found = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(found["input_ids"], dtype=np.int64)
    spans = np.asarray(found["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    starts, stops = spans[:, 0], spans[:, 1]
    marked = has_marks(template or tokenizer.chat_template or "")
    # where each message's render ends: the render of the messages up to it; a template with
    # marks may render earlier turns otherwise once later ones follow (a reasoning model's
    # thoughts dropped): there, where its content ends
    try:
        ends = _ends(tokenizer, messages, text, template, prompt)
    except ValueError:
        if not marked:
            raise
        ends = _content_ends(messages, text, prompt)
    owner = np.searchsorted(np.asarray(ends), starts, side="right")
    roles = [ROLES.index(m["role"]) for m in messages] + [ROLES.index("assistant")]
    role = np.asarray(roles, dtype=np.int8)[np.minimum(owner, len(roles) - 1)]
    if marked:
        mask = _marked(tokenizer, messages, template, ids, prompt)
        role[mask] = ROLES.index("assistant")  # what the marks hold, the assistant wrote
        return Turns(ids, mask, role, MARKS)
    mask = np.zeros(len(ids), dtype=bool)
    for n, message in enumerate(messages):
        if message["role"] == "assistant":
            # a first turn has no turns before it to render with the generation prompt (a
            # template may refuse none): its text begins where its content is found
            start = (len(_prefix(tokenizer, messages[:n], text, template, prompt=True)) if n
                     else max(0, text.find(message["content"])))
            # a token that reaches over the header's end into the text (a space merged into
            # the first word) is the text's
            mask |= (stops > start) & (starts < ends[n])
    return Turns(ids, mask, role, PREFIXES)


def _ends(tokenizer, messages: list[dict], text: str, template: str | None,
          prompt: bool) -> list[int]:
    ends = [len(_prefix(tokenizer, messages[:n], text, template)) for n in
            range(1, len(messages))]
    ends.append(len(_prefix(tokenizer, messages, text, template)) if prompt else len(text))
    return ends


def _content_ends(messages: list[dict], text: str, prompt: bool) -> list[int]:
    """Where each message's content ends in ``text``, found in order (the last message's
    render runs to the end, or to the generation prompt's start): an approximation, where the
    renders of the first turns are no prefix of the whole, in which a turn's closing tokens
    (its end token) count as the next turn's."""
    ends, at = [], 0
    for message in messages:
        found = text.find(message["content"], at)
        if found < 0:
            raise ValueError("the chat template changes a message's text, and its turns cannot "
                             "be told apart")
        at = found + len(message["content"])
        ends.append(at)
    if not prompt:
        ends[-1] = len(text)
    return ends


def _rendered(tokenizer, messages: list[dict], template: str | None,
              prompt: bool = False) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, chat_template=template,
                                             add_generation_prompt=prompt)
    except Exception as err:  # the template's own error (jinja's, or a raise_exception)
        said = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(f"the chat template fails on it ({said})") from None


def _prefix(tokenizer, messages: list[dict], whole: str, template: str | None,
            prompt: bool = False) -> str:
    # the render of the first messages, which must begin the whole's for the rule to hold
    if not messages and not prompt:
        return ""
    text = _rendered(tokenizer, messages, template, prompt)
    if not whole.startswith(text):
        raise ValueError("the chat template renders its first turns as no prefix of the whole "
                         "conversation, so its assistant tokens cannot be found by prefixes; "
                         "give the template {% generation %} marks (dataset.chat_template)")
    return text


def _marked(tokenizer, messages: list[dict], template: str | None, ids: np.ndarray,
            prompt: bool) -> np.ndarray:
    found = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                          chat_template=template, add_generation_prompt=prompt,
                                          return_assistant_tokens_mask=True)
    if not np.array_equal(np.asarray(found["input_ids"]), ids):
        raise ValueError("the chat template's tokens differ from its rendered text's")
    return np.asarray(found["assistant_masks"], dtype=bool)
