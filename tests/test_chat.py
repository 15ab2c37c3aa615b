"""Conversations (dataset=chat): each conversation rendered by the tokenizer's own chat template;
/loss_mask equals transformers' own assistant mask (a ChatML template, with the prefix rule
probe uses, against the same template with generation marks) and a hand-made one (a
Llama-3-style template with marks); /role names each token's message; the rows equal one
forward per conversation without probe; rows=assistant keeps the assistant's rows alone; every
bad conversation is one line, or left out and recorded. A tiny GPT-2 and a tokenizer given chat
special tokens here."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.errors import ConfigError, DataError
from tests.conftest import no_h5_files

transformers = pytest.importorskip("transformers")

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
           "<|end_header_id|>", "<|eot_id|>"]
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
          "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\n' }}{% endif %}")
# the same text, the assistant's part marked: transformers' own mask is the oracle
CHATML_MARKED = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}"
                 "{% if m['role'] == 'assistant' %}{% generation %}"
                 "{{ m['content'] + '<|im_end|>\n' }}{% endgeneration %}"
                 "{% else %}{{ m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3 = ("{{ '<|begin_of_text|>' }}{% for m in messages %}"
          "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' }}"
          "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|eot_id|>' }}"
          "{% endgeneration %}{% else %}{{ m['content'] + '<|eot_id|>' }}{% endif %}"
          "{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

CHATS = [
    {"messages": [{"role": "user", "content": "the cat sat on the mat"},
                  {"role": "assistant", "content": "a dog ran in the park"}]},
    {"messages": [{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "what sat"},
                  {"role": "assistant", "content": "the cat"},
                  {"role": "user", "content": "the dog ran"},
                  {"role": "assistant", "content": "in the park"}]},
    {"messages": [{"role": "user", "content": "the river ran"},
                  {"role": "assistant", "content": "by the park"}]},
]
LAYER = "transformer.h.0"  # hidden_states[1] (the last one has the final norm applied)


def _chat_lm(folder, tiny_lm, template: str):
    """The tiny GPT-2 with the chat special tokens added (embeddings resized) and ``template``
    as its tokenizer's chat template."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_lm)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL})
    tokenizer.chat_template = template
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_lm)
    model.resize_token_embeddings(len(tokenizer))
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["chatml", "llama3"])
def chat_lm(request, tiny_lm, tmp_path_factory):
    template = {"chatml": CHATML, "llama3": LLAMA3}[request.param]
    return request.param, _chat_lm(tmp_path_factory.mktemp(request.param), tiny_lm, template)


def _write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _cfg(make_cfg, lm, chats, *extra, output=None):
    return make_cfg("model=transformers", f"model.name={lm}", "dataset=chat",
                    f"dataset.path={chats}", f"layers=[{LAYER}]", "batch_size=2", *extra,
                    output=output)


def _expected(name: str, tokenizer, messages) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ids, the assistant mask and the roles, without probe: transformers' own mask from the
    marked ChatML template; for the Llama-3 one, built piece by piece (a message's header,
    then its content and end token, tokenized apart: special tokens split the text)."""
    roles = ("system", "user", "assistant", "tool")
    if name == "chatml":
        found = tokenizer.apply_chat_template(messages, chat_template=CHATML_MARKED,
                                              tokenize=True, return_dict=True,
                                              return_assistant_tokens_mask=True)
        ids, mask = np.asarray(found["input_ids"]), np.asarray(found["assistant_masks"], bool)
        role, at = [], 0  # each message's tokens: from its <|im_start|>
        starts = np.flatnonzero(ids == tokenizer.convert_tokens_to_ids("<|im_start|>"))
        for n, start in enumerate([*starts[1:], len(ids)]):
            role += [roles.index(messages[n]["role"])] * (int(start) - at)
            at = int(start)
        return ids, mask, np.asarray(role)
    ids, mask, role = [], [], []
    for n, message in enumerate(messages):
        head = tokenizer(("<|begin_of_text|>" if n == 0 else "") + "<|start_header_id|>"
                         + message["role"] + "<|end_header_id|>\n\n",
                         add_special_tokens=False)["input_ids"]
        body = tokenizer(message["content"] + "<|eot_id|>", add_special_tokens=False)["input_ids"]
        ids += head + body
        mask += [False] * len(head) + [message["role"] == "assistant"] * len(body)
        role += [roles.index(message["role"])] * (len(head) + len(body))
    return np.asarray(ids), np.asarray(mask), np.asarray(role)


def test_loss_mask_roles_and_rows_equal_each_conversation_alone(chat_lm, make_cfg, tmp_path,
                                                                caplog):
    name, lm = chat_lm
    chats = _write(tmp_path / "chats.jsonl", CHATS)
    caplog.set_level("INFO", logger="probe")
    path = probe.run(_cfg(make_cfg, lm, chats))
    tokenizer = transformers.AutoTokenizer.from_pretrained(lm)
    model = transformers.AutoModelForCausalLM.from_pretrained(lm).eval()
    way = "generation marks" if name == "llama3" else "prefix"
    assert any("assistant's tokens found by" in r.message and way in r.message
               for r in caplog.records)
    with h5py.File(path) as f:
        bounds = f["offsets"][:]
        assert list(f["role"].attrs["values"]) == ["system", "user", "assistant", "tool"]
        assert f["loss_mask"].dtype == bool
        for n, chat in enumerate(CHATS):
            part = slice(bounds[n], bounds[n + 1])
            ids, mask, role = _expected(name, tokenizer, chat["messages"])
            np.testing.assert_array_equal(f["input_ids"][part], ids)
            np.testing.assert_array_equal(f["loss_mask"][part], mask)
            np.testing.assert_array_equal(f["role"][part], role)
            assert mask.sum() > 0
            with torch.no_grad():
                alone = model(torch.as_tensor(ids)[None], output_hidden_states=True)
            np.testing.assert_allclose(f[f"{LAYER}/output"][part],
                                       alone.hidden_states[1][0].numpy(), rtol=1e-5, atol=1e-5)


def test_rows_of_the_assistant_alone(chat_lm, make_cfg, tmp_path):
    _, lm = chat_lm
    chats = _write(tmp_path / "chats.jsonl", CHATS)
    every = probe.run(_cfg(make_cfg, lm, chats, output=tmp_path / "all.h5"))
    mine = probe.run(_cfg(make_cfg, lm, chats, "dataset.rows=assistant",
                          output=tmp_path / "assistant.h5"))
    with h5py.File(every) as a, h5py.File(mine) as b:
        mask = a["loss_mask"][:]
        np.testing.assert_array_equal(b[f"{LAYER}/output"][:], a[f"{LAYER}/output"][:][mask])
        np.testing.assert_array_equal(b["input_ids"][:], a["input_ids"][:][mask])
        assert b["loss_mask"][:].all()
        assert (b["role"][:] == 2).all()
        counts = [int(mask[a["offsets"][n]:a["offsets"][n + 1]].sum()) for n in range(3)]
        np.testing.assert_array_equal(np.diff(b["offsets"][:]), counts)


def test_sharegpt_conversations_and_a_system_prompt(chat_lm, make_cfg, tmp_path):
    _, lm = chat_lm
    shared = [{"conversations": [{"from": "human", "value": m["content"]} if m["role"] == "user"
                                 else {"from": "gpt", "value": m["content"]}
                                 for m in chat["messages"] if m["role"] != "system"]}
              for chat in CHATS]
    plain = [{"messages": [{"role": "system", "content": "say little"},
                           *(m for m in chat["messages"] if m["role"] != "system")]}
             for chat in CHATS]
    a = probe.run(_cfg(make_cfg, lm, _write(tmp_path / "s.jsonl", shared),
                       "dataset.system_prompt='say little'", output=tmp_path / "s.h5"))
    b = probe.run(_cfg(make_cfg, lm, _write(tmp_path / "p.jsonl", plain),
                       output=tmp_path / "p.h5"))
    with h5py.File(a) as x, h5py.File(b) as y:
        for key in ("input_ids", "loss_mask", "role", f"{LAYER}/output"):
            np.testing.assert_array_equal(x[key][:], y[key][:], err_msg=key)
        assert (x["role"][:x["offsets"][1]] == 0).any()  # the system turn is there


@pytest.mark.parametrize("row, said", [
    ({"messages": [{"role": "user", "content": "hi"}]}, "has no assistant turn"),
    ({"messages": [{"role": "wizard", "content": "hi"}, {"role": "assistant", "content": "x"}]},
     "role 'wizard', not one of system, user, assistant, tool"),
    ({"messages": "hello"}, "not a list of messages"),
])
def test_a_bad_conversation_is_one_line_or_left_out(row, said, chat_lm, make_cfg, tmp_path):
    _, lm = chat_lm
    chats = _write(tmp_path / "chats.jsonl", [CHATS[0], row, CHATS[2]])
    with pytest.raises(DataError) as caught:
        probe.run(_cfg(make_cfg, lm, chats))
    assert said in str(caught.value) and "\n" not in str(caught.value)
    assert "conversation 1 of" in str(caught.value)
    assert no_h5_files(tmp_path)
    path = probe.run(_cfg(make_cfg, lm, chats, "dataset.on_error=skip"))
    with h5py.File(path) as f:
        np.testing.assert_array_equal(f["index"][:], [0, 2])
        np.testing.assert_array_equal(f["skipped"][:], [1])


def test_a_tokenizer_without_a_chat_template_is_one_line(tiny_lm, make_cfg, tmp_path):
    chats = _write(tmp_path / "chats.jsonl", [CHATS[0], CHATS[2]])  # no chat tokens: long
    with pytest.raises(ConfigError, match="has no chat template; set dataset.chat_template="):
        probe.run(_cfg(make_cfg, tiny_lm, chats))
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    path = probe.run(_cfg(make_cfg, tiny_lm, chats, f"dataset.chat_template={template}"))
    with h5py.File(path) as f:
        assert f["loss_mask"][:].any()


def test_a_killed_chat_run_resumes_to_the_uninterrupted_file(chat_lm, make_cfg, tmp_path,
                                                             monkeypatch):
    from tests.conftest import assert_same_datasets, interrupt_after

    _, lm = chat_lm
    chats = _write(tmp_path / "chats.jsonl", CHATS * 2)
    extra = ("batch_size=1", "output.commit_every=1", "bucket_by_length=false")
    whole = probe.run(_cfg(make_cfg, lm, chats, *extra, output=tmp_path / "whole.h5"))
    cfg = _cfg(make_cfg, lm, chats, *extra, output=tmp_path / "killed.h5")
    interrupt_after(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        probe.run(cfg)
    resumed = probe.run(cfg)
    assert_same_datasets(whole, resumed, ["input_ids", "loss_mask", "role", "offsets",
                                          f"{LAYER}/output", "index"])


def test_generation_answers_each_conversations_last_turn_anew(chat_lm, make_cfg, tmp_path):
    # the prompt: the conversation before its last turn, with the generation prompt, as the
    # template renders it; the answer: the model's greedy tokens, the assistant's in the mask
    name, lm = chat_lm
    new = 3
    chats = _write(tmp_path / "chats.jsonl", CHATS)
    path = probe.run(_cfg(make_cfg, lm, chats, f"generate.max_new_tokens={new}",
                          "generate.stop_at_eos=false"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(lm)
    model = transformers.AutoModelForCausalLM.from_pretrained(lm).eval()
    with h5py.File(path) as f:
        bounds = f["offsets"][:]
        for n, chat in enumerate(CHATS):
            part = slice(bounds[n], bounds[n + 1])
            prompt = tokenizer.apply_chat_template(chat["messages"][:-1], tokenize=True,
                                                   add_generation_prompt=True,
                                                   return_dict=True)["input_ids"]
            sequence = list(prompt)
            for _ in range(new):  # greedy, without a cache
                with torch.no_grad():
                    logits = model(torch.tensor([sequence])).logits
                sequence.append(int(logits[0, -1].argmax()))
            np.testing.assert_array_equal(f["input_ids"][part], sequence)
            generated = f["generated"][part]
            np.testing.assert_array_equal(generated, [False] * len(prompt) + [True] * new)
            mask, role = f["loss_mask"][part], f["role"][part]
            assert mask[generated].all() and (role[generated] == 2).all()
            _, before, _ = _expected(name, tokenizer, chat["messages"][:-1])
            np.testing.assert_array_equal(mask[:len(before)], before)  # earlier answers
            assert not mask[len(before):len(prompt)].any()  # the assistant's header
            assert (role[len(before):len(prompt)] == 2).all()
            with torch.no_grad():
                alone = model(torch.tensor([sequence]), output_hidden_states=True)
            np.testing.assert_allclose(f[f"{LAYER}/output"][part],
                                       alone.hidden_states[1][0].numpy(), rtol=1e-5, atol=1e-5)


def test_generating_from_a_conversation_that_ends_with_a_user_turn_is_one_line(
        chat_lm, make_cfg, tmp_path):
    _, lm = chat_lm
    ending = {"messages": [*CHATS[0]["messages"], {"role": "user", "content": "and then"}]}
    chats = _write(tmp_path / "chats.jsonl", [ending])
    with pytest.raises(DataError) as caught:
        probe.run(_cfg(make_cfg, lm, chats, "generate.max_new_tokens=2"))
    said = str(caught.value)
    assert "ends with a user turn" in said and "\n" not in said


# -- speculators' training folder --------------------------------------------------------------

def test_the_speculators_folder_loads_back_equal(chat_lm, make_cfg, tmp_path):
    # read as speculators' ArrowDataset reads it: load_from_disk, then hs_<i>.safetensors,
    # token_ids torch.equal to the row's input_ids, hidden_states[:, :-1] the auxiliary layers
    # and [:, -1] the last block's output (before the final norm)
    datasets = pytest.importorskip("datasets")
    safetensors = pytest.importorskip("safetensors.torch")
    from probe.file.exports import export

    _, lm = chat_lm
    chats = _write(tmp_path / "chats.jsonl", CHATS)
    path = probe.run(_cfg(make_cfg, lm, chats, "layers=[transformer.h.0,transformer.h.1]"))
    done = export(path, "speculators", out_dir=tmp_path / "spec", aux=[1])
    small = export(path, "speculators", out_dir=tmp_path / "small", aux=[1], memory_mb=0.001)
    for i in range(len(CHATS)):  # read a conversation at a time, or many: the same files
        name = f"hidden_states/hs_{i}.safetensors"
        assert (done.out_dir / name).read_bytes() == (small.out_dir / name).read_bytes()
    model = transformers.AutoModelForCausalLM.from_pretrained(lm).eval()
    table = datasets.load_from_disk(str(done.out_dir))
    assert table.column_names == ["input_ids", "loss_mask", "seq_len"]
    with h5py.File(path) as f:
        bounds = f["offsets"][:]
        for i in range(len(CHATS)):
            part = slice(bounds[i], bounds[i + 1])
            row = table[i]
            assert row["input_ids"].dtype == torch.int64 and row["loss_mask"].dtype == torch.int64
            np.testing.assert_array_equal(row["loss_mask"].numpy(), f["loss_mask"][part])
            assert int(row["seq_len"]) == bounds[i + 1] - bounds[i]
            loaded = safetensors.load_file(str(done.out_dir / "hidden_states" /
                                               f"hs_{i}.safetensors"))
            assert torch.equal(loaded["token_ids"], row["input_ids"])
            states = loaded["hidden_states"]
            assert states.dtype == torch.bfloat16 and states.shape == (len(row["input_ids"]), 2,
                                                                       32)
            with torch.no_grad():  # id 1: the output of block 0, as HF's hidden_states[1]
                seen = model(row["input_ids"][None], output_hidden_states=True)
            np.testing.assert_array_equal(
                states[:, :-1].flatten(1).float().numpy(),
                seen.hidden_states[1][0].to(torch.bfloat16).float().numpy())
            np.testing.assert_array_equal(  # id 2 = L: the last block's, before ln_f
                states[:, -1].float().numpy(),
                torch.from_numpy(f["transformer.h.1/output"][part]).to(torch.bfloat16)
                .float().numpy())


def test_the_speculators_export_says_what_it_misses_in_one_line(chat_lm, make_cfg, tmp_path):
    from probe.file.exports import export

    _, lm = chat_lm
    chats = _write(tmp_path / "chats.jsonl", CHATS)
    path = probe.run(_cfg(make_cfg, lm, chats, "layers=[transformer.h.1]"))
    with pytest.raises(ConfigError, match=r"layer id -1 is not a block's output of the 2 "
                                          r"blocks \(EAGLE-3's default"):
        export(path, "speculators", out_dir=tmp_path / "a")
    with pytest.raises(ConfigError, match=r"needs transformer.h.0/output, .*'layers=\["
                                          r"transformer.h.0,transformer.h.1\]'"):
        export(path, "speculators", out_dir=tmp_path / "b", aux=[1])
    from tests.tiny_text import documents, write_jsonl

    docs = write_jsonl(tmp_path / "docs.jsonl", documents(3, seed=2, low=2, high=6))
    text = probe.run(make_cfg("model=transformers", f"model.name={lm}", "dataset=text",
                              f"dataset.path={docs}", f"layers=[{LAYER}]",
                              output=tmp_path / "text.h5"))
    with pytest.raises(ConfigError, match="run probe with dataset=chat"):
        export(text, "speculators", out_dir=tmp_path / "c", aux=[1])


def test_a_bad_conversation_late_in_the_run_is_found_before_any_file(chat_lm, make_cfg,
                                                                     tmp_path):
    _, lm = chat_lm
    late = [*CHATS, *CHATS, {"messages": [{"role": "user", "content": "only a question"}]}]
    chats = _write(tmp_path / "chats.jsonl", late)
    with pytest.raises(DataError, match="conversation 6 of .* has no assistant turn"):
        probe.run(_cfg(make_cfg, lm, chats, "batch_size=1"))
    assert no_h5_files(tmp_path)


def test_shards_of_a_chat_run_merge_into_the_whole_run(chat_lm, make_cfg, tmp_path):
    from probe.file.merge import merge

    _, lm = chat_lm
    chats = _write(tmp_path / "chats.jsonl", CHATS * 2)
    whole = probe.run(_cfg(make_cfg, lm, chats, output=tmp_path / "whole.h5"))
    shards = [probe.run(_cfg(make_cfg, lm, chats, f"shard.index={i}", "shard.count=2",
                             output=tmp_path / f"s{i}.h5")) for i in range(2)]
    merged = merge(tmp_path / "merged.h5", shards)
    with probe.open(whole) as a, probe.open(merged) as b:
        for index in range(len(CHATS) * 2):  # text runs merge shard after shard: by /index
            for key in (f"{LAYER}/output",):
                np.testing.assert_allclose(b.rows_of(key, index), a.rows_of(key, index),
                                           rtol=1e-5, atol=1e-6)
        order = np.argsort(b.index, kind="stable")
        bounds = b.offsets
        for name in ("loss_mask", "role", "input_ids"):
            joined = np.concatenate([b._file[name][bounds[r]:bounds[r + 1]] for r in order])
            np.testing.assert_array_equal(joined, a._file[name][:], err_msg=name)


def test_a_role_the_template_refuses_is_one_line(tiny_lm, make_cfg, tmp_path):
    template = tmp_path / "no_tools.jinja"
    template.write_text("{% for m in messages %}{% if m['role'] == 'tool' %}"
                        "{{ raise_exception('tool turns are not supported') }}{% endif %}"
                        "{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}")
    tool = {"messages": [{"role": "user", "content": "the cat"},
                         {"role": "tool", "content": "a dog"},
                         {"role": "assistant", "content": "the mat"}]}
    chats = _write(tmp_path / "chats.jsonl", [CHATS[0], tool])
    with pytest.raises(DataError) as caught:
        probe.run(_cfg(make_cfg, tiny_lm, chats, f"dataset.chat_template={template}"))
    said = str(caught.value)
    assert "conversation 1 of" in said and "tool turns are not supported" in said
    assert "\n" not in said


# -- render, on templates that stretch the rules ---------------------------------------------

@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE that merges a space into the word after it (as GPT-2's, Llama's and
    Qwen's do), with ChatML's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL[:2],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["user: the cat sat\nassistant: a dog ran in the park\n"] * 50,
                                  trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def _marked_version(template: str) -> str:
    """ChatML-like ``template`` with the assistant's text marked: transformers' oracle."""
    return template.replace("{{ m['role'] + ': ' + m['content'] + '\\n' }}",
                            "{{ m['role'] + ': ' }}{% if m['role'] == 'assistant' %}"
                            "{% generation %}{{ m['content'] + '\\n' }}{% endgeneration %}"
                            "{% else %}{{ m['content'] + '\\n' }}{% endif %}")


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "the cat"}, {"role": "assistant", "content": "dog ran"}],
    [{"role": "assistant", "content": "a dog"}, {"role": "user", "content": "the cat"},
     {"role": "assistant", "content": "in the park"}],
], ids=["space-before-the-text", "assistant-first"])
def test_the_prefix_rule_equals_transformers_mask_where_tokens_cross_the_header(bpe, messages):
    from probe.data.text.turns import render

    plain = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
             "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")
    ours = render(bpe, messages, plain)
    theirs = bpe.apply_chat_template(messages, chat_template=_marked_version(plain),
                                     tokenize=True, return_dict=True,
                                     return_assistant_tokens_mask=True)
    assert ours.way.startswith("the renders")
    np.testing.assert_array_equal(ours.ids, theirs["input_ids"])
    np.testing.assert_array_equal(ours.loss_mask, np.asarray(theirs["assistant_masks"], bool))


def test_a_marked_template_that_renders_the_last_turn_its_own_way(bpe):
    # as a reasoning model's: thoughts on the last answer alone, so the first turns' render is
    # no prefix of the whole; the marks give the mask, the turns' text their roles
    from probe.data.text.turns import render

    template = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
                "{% if m['role'] == 'assistant' %}{% generation %}"
                "{% if loop.last %}{{ '<think></think>' }}{% endif %}"
                "{{ m['content'] + '<|im_end|>\\n' }}{% endgeneration %}"
                "{% else %}{{ m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}")
    messages = [{"role": "user", "content": "the cat"}, {"role": "assistant", "content": "a dog"},
                {"role": "user", "content": "sat"}, {"role": "assistant", "content": "ran"}]
    ours = render(bpe, messages, template)
    theirs = bpe.apply_chat_template(messages, chat_template=template, tokenize=True,
                                     return_dict=True, return_assistant_tokens_mask=True)
    np.testing.assert_array_equal(ours.loss_mask, np.asarray(theirs["assistant_masks"], bool))
    assert (ours.role[ours.loss_mask] == 2).all()
    starts = np.flatnonzero(ours.ids == bpe.convert_tokens_to_ids("<|im_start|>"))
    assert [int(ours.role[s]) for s in starts] == [1, 2, 1, 2]  # each turn's header its own


def test_a_prompt_longer_than_max_length_is_refused_when_generating(chat_lm, make_cfg,
                                                                    tmp_path):
    # cut, it would lose the generation prompt at its end: one line, before any file
    _, lm = chat_lm
    chats = _write(tmp_path / "chats.jsonl", CHATS)
    with pytest.raises(DataError, match=r"conversation 0 of .*its prompt has \d+ tokens, beyond "
                                        r"dataset.max_length=12"):
        probe.run(_cfg(make_cfg, lm, chats, "generate.max_new_tokens=2",
                       "dataset.max_length=12"))
    assert no_h5_files(tmp_path)
