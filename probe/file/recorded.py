"""The config a file records, compared with another: which keys change what is stored. A run
resumes, or finds its finished file, only where the two agree; a merge joins only shards
that agree. The names are the config schema's (probe.config.schema imports them from here:
the file says what makes two of its runs the same).

    differing_keys(a, b)     the dotted keys whose values differ, less ``NEUTRAL_KEYS``
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["NEUTRAL_KEYS", "MOVED_TARGETS", "ADDED_KEYS", "differing_keys"]

# Keys that do not change what is stored: a run may resume, or find its finished file, with other
# values of these. conf/config.yaml leaves the same keys out of the run folder's name (a test
# holds the two lists equal).
NEUTRAL_KEYS = ("batch_size", "batch_tokens", "bucket_by_length", "num_workers", "device",
                "stop_early", "output.path",
                "output.overwrite", "output.commit_every", "output.commit_seconds",
                "output.check_free_space", "output.file_locking")


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
ADDED_KEYS = {"generate.max_new_tokens": 0, "generate.do_sample": False,
              "generate.temperature": None, "generate.top_p": None,
              "generate.stop_at_eos": True, "generate.rows": "all"}


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
