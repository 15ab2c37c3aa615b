"""What a file records of its run, compared with another's: which keys of the config change
what is stored, and how the model and data fingerprints differ. A run resumes, or finds its
finished file, only where the two agree; a merge joins only shards that agree; an analysis
pairs the rows of two files only where their data agree. The config's names are the
schema's (probe.config.schema imports them from here: the file says what makes two of its
runs the same); the fingerprints are made by probe.pipeline.fingerprint.

    differing_keys(a, b)     the dotted keys whose values differ, less ``NEUTRAL_KEYS``
    changes(stored, current) what differs between two fingerprints, in words
"""

from __future__ import annotations

import json
from collections.abc import Mapping

__all__ = ["NEUTRAL_KEYS", "MOVED_TARGETS", "ADDED_KEYS", "QUIET_DEFAULTS", "recorded_config",
           "differing_keys", "changes", "dumps", "loads"]

# Keys that do not change what is stored: a run may resume, or find its finished file, with other
# values of these. conf/config.yaml leaves the same keys out of the run folder's name (a test
# holds the two lists equal).
NEUTRAL_KEYS = ("batch_size", "batch_tokens", "bucket_by_length", "num_workers", "device",
                "stop_early", "verify", "output.path",
                "output.overwrite", "output.commit_every", "output.commit_seconds",
                "output.check_free_space", "output.file_locking", "output.fidelity_rows")


# factories that moved in 0.2 (the floors of folders), by their old names: a file that an
# earlier version started records them, and resumes under the new ones
MOVED_TARGETS = {
    "probe.data.SyntheticImages": "probe.data.images.SyntheticImages",
    "probe.data.image_folder": "probe.data.images.image_folder",
    "probe.data.cifar10": "probe.data.images.cifar10",
    "probe.text.data.TextDataset": "probe.data.text.corpus.TextDataset",
    "probe.text.ids.TokenIds": "probe.data.tokens.TokenIds",
    "probe.audio.data.AudioDataset": "probe.data.audio.clips.AudioDataset",
    "probe.feeds.pairs.PairsDataset": "probe.data.pairs.PairsDataset",
}


# keys added after 0.2, with the default that a config written before them meant
ADDED_KEYS = {"reduce_components": None, "reduce_fit_samples": 256,
              "output.fidelity_rows": 256, "generate.max_new_tokens": 0,
              "generate.do_sample": False,
              "generate.temperature": None, "generate.top_p": None,
              "generate.stop_at_eos": True, "generate.rows": "all",
              **(_STORY_KEYS := {"dataset.onset_column": "onset",
                                 "dataset.offset_column": "offset",
                                 "dataset.context_tokens": None,
                                 "dataset.context_stride": None}),
              "dataset.target_column": None}


# keys added after 0.2 that a file records only where set: a run that leaves them at their
# default writes the config that 0.2 wrote
QUIET_DEFAULTS = {"intervene": None, "verify": True, "reduce_components": None,
                  "reduce_fit_samples": 256, "output.fidelity_rows": 256, **_STORY_KEYS,
                  "dataset.target_column": None}


def recorded_config(values: dict, prefix: str = "") -> dict:
    """A resolved config (as a dict) as a file records it: ``QUIET_DEFAULTS`` (dotted keys)
    left out where they hold their default."""
    kept = {}
    for key, value in values.items():
        name = prefix + str(key)
        if name in QUIET_DEFAULTS and value == QUIET_DEFAULTS[name]:
            continue
        kept[key] = recorded_config(value, name + ".") if isinstance(value, dict) else value
    return kept


def differing_keys(a: Mapping, b: Mapping, ignore: tuple[str, ...] = NEUTRAL_KEYS) -> list[str]:
    """Dotted keys whose values differ between two configs, leaving out ``ignore`` (a factory
    named by its name before it moved is the same factory; a key that one config predates
    holds its default there)."""
    flat_a, flat_b = _flatten(a), _flatten(b)
    keys = sorted(set(flat_a) | set(flat_b))
    return [k for k in keys if k not in ignore
            and flat_a.get(k, ADDED_KEYS.get(k)) != flat_b.get(k, ADDED_KEYS.get(k))]


def _flatten(node: Mapping, prefix: str = "") -> dict:
    flat: dict = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = MOVED_TARGETS.get(value, value) if key == "_target_" else value
    return flat


_SAID = {
    "length": lambda old, new: f"{old} samples then, {new} now",
    "num_files": lambda old, new: f"{old} files then, {new} now",
    "files": lambda old, new: "the names or sizes of its files differ",
    "modules": lambda old, new: "its modules differ",
    "parameters": lambda old, new: "its parameter names or shapes differ",
    "weights": lambda old, new: "its weights differ",
    "interventions": lambda old, new: "their vectors, means or source files differ",
    "code": lambda old, new: "the code of {} changed".format(", ".join(
        sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k)))),
}


def changes(stored: dict, current: dict) -> list[str]:
    """The parts of two fingerprints that differ, in words; [] when they agree. Parts that
    only one of them has (a file from an older version) are not compared."""
    said = []
    shared = set(stored) & set(current)
    for part in [*(p for p in _SAID if p in shared), *sorted(shared - set(_SAID))]:
        old, new = stored[part], current[part]
        if old != new:
            words = _SAID.get(part)
            said.append(words(old, new) if words else f"{part}: {old} then, {new} now")
    return said


def dumps(fingerprint: dict) -> str:
    return json.dumps(fingerprint, sort_keys=True)


def loads(text) -> dict | None:
    """A stored fingerprint, or None where the file has none."""
    return None if text is None else json.loads(str(text))
