"""Which rows of two files hold the same thing: the samples both hold, matched by ``/index``,
or, for rows per token (``tokens=all``), the tokens of the documents both hold, when both
files hold the very same tokens of each."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from probe.analyses.stats import match_index, read_rows
from probe.errors import ConfigError, DataError
from probe.file.format import INPUT_IDS, OFFSETS, Attr, bounds_of
from probe.file.read import FeatureFile
from probe.file.recorded import loads

__all__ = ["Pairing", "pair_rows"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pairing:
    """Rows ``rows_a[k]`` of the first file and ``rows_b[k]`` of the second hold the same
    sample (or token) k, whose dataset index is ``index[k]``."""

    rows_a: np.ndarray
    rows_b: np.ndarray
    index: np.ndarray
    samples: int  # samples (documents) shared
    per_token: bool
    # where the files' data differ and they were paired anyway (pair_anyway): what differs
    anyway: str | None = None


def pair_rows(fa: FeatureFile, keys_a: list[str], fb: FeatureFile | None = None,
              keys_b: list[str] | None = None, *, anyway: bool = False) -> Pairing:
    """The rows to compare: all of ``fa``'s when ``fb`` is None, else those both files hold.
    Files made from different datasets (their data fingerprints differ) are refused, unless
    ``anyway``: their /index values then name the same samples, the caller says.

    Raises:
        ConfigError: keys with rows per token mixed with keys with rows per sample.
        DataError: the files were made from different datasets, share no sample, or their
            shared documents hold other tokens.
    """
    per_token = _row_kind(fa, keys_a, fb, keys_b or [])
    if fb is None:
        total = int(fa.offsets[-1]) if per_token else fa.num_rows
        rows = np.arange(total)
        index = fa.index
        if per_token:
            index = np.repeat(index, np.diff(fa.offsets))
        return Pairing(rows, rows, index, fa.num_rows, per_token)
    different = _different_data(fa, fb, anyway)
    docs_a, docs_b = match_index(fa.index, fb.index)
    if len(docs_a) == 0:
        raise DataError(
            f"file={str(fa.path)!r} and other={str(fb.path)!r} share no sample: their /index "
            f"hold {_span(fa.index)} and {_span(fb.index)}; compare files made from the same "
            "dataset (runs of another limit, subset or shard hold other samples)")
    log.info("matched %d samples by /index (%s holds %d, %s %d)", len(docs_a), fa.path.name,
             fa.num_rows, fb.path.name, fb.num_rows)
    index = fa.index[docs_a]
    if not per_token:
        return Pairing(docs_a, docs_b, index, len(docs_a), False, different)
    rows_a, lengths_a = _token_rows(fa.offsets, docs_a)
    rows_b, lengths_b = _token_rows(fb.offsets, docs_b)
    differ = np.flatnonzero(lengths_a != lengths_b)
    if not len(differ) and INPUT_IDS in fa and INPUT_IDS in fb:
        same = read_rows(fa[INPUT_IDS], rows_a) == read_rows(fb[INPUT_IDS], rows_b)
        if not same.all():
            token = int(np.flatnonzero(~same)[0])
            differ = [int(np.searchsorted(np.cumsum(lengths_a), token, side="right"))]
    if len(differ):
        sample = int(index[differ[0]])
        raise DataError(
            f"file={str(fa.path)!r} and other={str(fb.path)!r} hold other tokens for dataset "
            f"sample {sample} ({int(lengths_a[differ[0]])} and {int(lengths_b[differ[0]])} "
            "rows), so their token rows cannot be paired; compare one row per document: run "
            "probe with tokens=last or tokens=mean")
    return Pairing(rows_a, rows_b, np.repeat(index, lengths_a), len(docs_a), True, different)


def _different_data(fa: FeatureFile, fb: FeatureFile, anyway: bool) -> str | None:
    """What differs between the datasets two files were made from (None: nothing, or a file
    made before data fingerprints were kept).

    Raises:
        DataError: they differ, and not ``anyway``.
    """
    a, b = (loads(f.attrs.get(Attr.DATA_FINGERPRINT)) for f in (fa, fb))
    if a is None or b is None:
        return None
    parts = [part for part in sorted(set(a) & set(b)) if a[part] != b[part]]
    if not parts:
        return None
    said = (f"file={str(fa.path)!r} was made from {_source(fa)} and other={str(fb.path)!r} "
            f"from {_source(fb)}, whose data fingerprints differ ({', '.join(parts)})")
    if not anyway:
        raise DataError(f"{said}: rows that share an /index are not the same samples; compare "
                        "files of one dataset, or set pair_anyway=true where their indices do "
                        "name the same samples")
    log.warning("%s; paired by /index anyway (pair_anyway=true)", said)
    return said


def _source(f: FeatureFile) -> str:
    # the dataset a file's run read, in words: its factory and what it read
    node = f.config.get("dataset") or {}
    name = str(node.get("_target_", "a dataset")).rsplit(".", 1)[-1]
    read = next((f"{key}={node[key]}" for key in ("path", "root", "name") if node.get(key)), "")
    return f"{name}({read})"


def _row_kind(fa: FeatureFile, keys_a: list[str], fb: FeatureFile | None,
              keys_b: list[str]) -> bool:
    kinds = {key: fa.per_token(key) for key in keys_a}
    if fb is not None:
        kinds.update({f"other's {key}": fb.per_token(key) for key in keys_b})
    if len(set(kinds.values())) > 1:
        token = next(k for k, v in kinds.items() if v)
        sample = next(k for k, v in kinds.items() if not v)
        raise ConfigError(
            f"{token} holds one row per token (tokens=all) and {sample} one row per sample; "
            "compare keys of one kind of rows (pick them with keys= and other_keys=), or run "
            "probe with tokens=last or tokens=mean for one row per document")
    decoded = [key for key in keys_a if kinds[key] and bounds_of(fa[key].attrs) != OFFSETS] + [
        f"other's {key}" for key in keys_b if fb is not None and fb.per_token(key)
        and bounds_of(fb[key].attrs) != OFFSETS]
    if decoded:  # an encoder-decoder's decoder rows: a target's tokens, not the text's
        raise ConfigError(
            f"{decoded[0]} holds a row per token of a decoder's target (/decoder_offsets), "
            "which compare does not pair yet; compare its encoder's keys, or run probe with "
            "tokens=mean for one row per sample")
    return bool(next(iter(kinds.values())))


def _token_rows(offsets: np.ndarray, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # every token row of the documents, document after document, and each one's length
    starts, lengths = offsets[docs], offsets[docs + 1] - offsets[docs]
    total = int(lengths.sum())
    first = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return first + np.arange(total), lengths


def _span(index: np.ndarray) -> str:
    return f"{len(index)} samples from {int(index.min())} to {int(index.max())}" if len(
        index) else "no sample"
