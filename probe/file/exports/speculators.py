"""``to=speculators``: the folder that vLLM's speculators trains EAGLE-3 draft models from, made
from a conversation run (``dataset=chat``) that stored its blocks' outputs for every token.

    D/                         a ``datasets`` folder (``save_to_disk``, torch format): a row per
                               conversation, ``input_ids`` and ``loss_mask`` (int64) and
                               ``seq_len``
    D/hidden_states/hs_<i>.safetensors
                               conversation i: ``token_ids`` [seq] int64 and ``hidden_states``
                               [seq, layers, hidden] bfloat16: the auxiliary layers in order,
                               then the last block's output (before the final norm)

as speculators' ``scripts/prepare_data.py`` and vLLM's hidden-states connector write them
(speculators ``src/speculators/train/data.py`` reads them: it checks ``token_ids`` against the
row's ``input_ids`` with ``torch.equal``, takes ``hidden_states[:, :-1]`` as the auxiliary
states and ``hidden_states[:, -1]`` as the verifier's last, which it normalises itself).

Layer ids count as speculators and vLLM count them: id i is the residual stream entering
block i, the output of block i - 1 (0 would be the embeddings, which this export does not
take); id L, the number of blocks, is the last block's output. ``aux`` defaults to EAGLE-3's
``[2, L // 2, L - 3]``. A run of conversations at a time, as many as ``memory_mb`` holds (at
least one): each key is read once per run. Row i of the folder is the file's row i.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np

from probe.errors import ConfigError
from probe.file.exports.stream import Source
from probe.file.format import INPUT_IDS, LOSS_MASK, OFFSETS, Attr, dataset_key

__all__ = ["SpeculatorsExport"]

_BLOCK = re.compile(r"^(.*)\.(\d+)$")


class SpeculatorsExport:
    """A conversation run's rows as speculators' training folder (see the module).

    Raises:
        ConfigError: not a conversation run of every token's rows, no blocks found, or a layer
            id whose block's output the file does not hold (naming the capture that would).
    """

    def __init__(self, source: Source, *, aux: list[int] | None):
        attrs = source.file.attrs
        if LOSS_MASK not in source or OFFSETS not in source:
            raise ConfigError(
                f"to=speculators needs a conversation run's token rows and /loss_mask, and "
                f"{str(source.path)!r} has none; run probe with dataset=chat (tokens=all)")
        if str(attrs.get("rows", "all")) != "all":
            raise ConfigError("to=speculators needs every token's row, and the run kept the "
                              "assistant's alone (dataset.rows=assistant); run it with "
                              "dataset.rows=all")
        self.source = source
        prefix, depth = _blocks(source)
        self.ids = _ids(aux, depth)
        self.keys = [dataset_key(f"{prefix}.{i - 1}", "output") for i in self.ids]
        missing = [key for key in self.keys if key not in source.file.features]
        if missing:
            layers = ",".join(key.rpartition("/")[0] for key in self.keys)
            raise ConfigError(
                f"to=speculators with layer ids {self.ids} needs {', '.join(missing)}, which "
                f"{str(source.path)!r} does not hold; run probe with 'layers=[{layers}]'")

    def _width(self) -> int:
        return int(np.prod(self.source[self.keys[0]].shape[1:]))

    def _token_bytes(self) -> int:
        # a token's rows as read (float32) and as written (bfloat16), every key
        return 6 * self._width() * len(self.keys)

    def write(self, folder: Path, budget: int) -> list[tuple[Path, int | None]]:
        import datasets
        import torch
        from safetensors.torch import save_file

        offsets = self.source.offsets()
        ids_of, masks, lengths = [], [], []
        (folder / "hidden_states").mkdir(parents=True, exist_ok=True)
        written = []
        for first, last in _runs(offsets, budget // max(1, self._token_bytes())):
            # the rows of a run of conversations, read once per key: one read each, not one
            # per conversation and key
            start, stop = int(offsets[first]), int(offsets[last])
            ids = torch.from_numpy(np.asarray(self.source[INPUT_IDS][start:stop],
                                              dtype=np.int64))
            mask = np.asarray(self.source[LOSS_MASK][start:stop], dtype=np.int64)
            rows = torch.empty((stop - start, len(self.keys), self._width()),
                               dtype=torch.bfloat16)
            for n, key in enumerate(self.keys):
                rows[:, n] = torch.from_numpy(np.asarray(self.source[key][start:stop]))
            for i in range(first, last):
                part = slice(int(offsets[i]) - start, int(offsets[i + 1]) - start)
                path = Path("hidden_states") / f"hs_{i}.safetensors"
                # slices along the first axis: contiguous, each written as its own bytes
                save_file({"token_ids": ids[part], "hidden_states": rows[part]},
                          str(folder / path))
                written.append((path, part.stop - part.start))
                ids_of.append(ids[part].numpy())
                masks.append(mask[part])
                lengths.append(part.stop - part.start)
        table = datasets.Dataset.from_dict({"input_ids": ids_of, "loss_mask": masks,
                                            "seq_len": lengths})
        table.set_format(type="torch")
        table.save_to_disk(str(folder))
        saved = sorted(f.name for f in folder.iterdir() if f.is_file())  # the datasets files
        return [*((Path(name), None) for name in saved), *written]


def _runs(offsets: np.ndarray, tokens: int) -> list[tuple[int, int]]:
    """Runs ``(first, last)`` of consecutive conversations of about ``tokens`` rows each (at
    least one conversation)."""
    runs, first = [], 0
    while first < len(offsets) - 1:
        last = int(np.searchsorted(offsets, offsets[first] + max(1, tokens), side="right")) - 1
        last = min(max(last, first + 1), len(offsets) - 1)
        runs.append((first, last))
        first = last
    return runs


def _ids(aux: list[int] | None, depth: int) -> list[int]:
    chosen = [2, depth // 2, depth - 3] if aux is None else [int(i) for i in aux]
    bad = [i for i in chosen if not 1 <= i <= depth]
    if bad:
        default = " (EAGLE-3's default [2, L // 2, L - 3]; set aux=[...])" if aux is None else ""
        raise ConfigError(f"to=speculators: layer id {bad[0]} is not a block's output of the "
                          f"{depth} blocks{default}; use ids 1 to {depth} (id i: the output of "
                          "block i - 1)")
    return [*chosen, depth]


def _blocks(source: Source) -> tuple[str, int]:
    """The module path that holds the model's blocks, and how many there are (the model's
    own config says, as recorded with the run; else the stored layers)."""
    layers = [str(name) for name in source.file.attrs.get(Attr.LAYERS, [])]
    found = Counter(m.group(1) for m in map(_BLOCK.match, layers) if m)
    if not found:
        raise ConfigError(f"to=speculators found no blocks (<path>.<n>) among the layers of "
                          f"{str(source.path)!r} ({', '.join(layers)}); store the blocks' "
                          "outputs, e.g. 'layers=[model.layers.*]'")
    return found.most_common(1)[0][0], _depth(source)


def _depth(source: Source) -> int:
    """The number of blocks, from the checkpoint's config that the run's config names (the
    stored blocks may be a few of them: the last one's id is the depth)."""
    name = source.file.config.get("model", {}).get("name")
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(name))
    except (ImportError, OSError, ValueError) as err:
        said = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"to=speculators counts the model's blocks from its config, and "
                          f"model.name={name!r} of the run cannot be read ({said}); export "
                          "where its folder or Hub cache is") from None
    config = getattr(config, "text_config", None) or config
    for attribute in ("num_hidden_layers", "n_layer", "num_layers"):
        value = getattr(config, attribute, None)
        if isinstance(value, int):
            return value
    raise ConfigError(f"to=speculators: the config of model.name={name!r} says no number of "
                      "layers (num_hidden_layers)")
