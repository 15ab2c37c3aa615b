"""``python -m probe.merge -o OUT SHARD...``, and the Hydra callback that merges the shards of a
multirun by itself when the sweep ends."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra.experimental.callback import Callback

from probe.commands import exit_on_user_error, to_log_files
from probe.config.folders import shard_groups
from probe.errors import ProbeError

__all__ = ["main", "MergeShards"]

log = logging.getLogger(__name__)


class MergeShards(Callback):
    """At the end of a multirun, each complete set of shard files in the sweep folder is merged
    into ``<sweep dir>/<the jobs' folder name without shard.index>.h5``, with virtual datasets.
    Sets that are incomplete (a sweep of some shards only), or already merged, are left alone;
    a complete set that does not merge fails the sweep, with one line for each such set, after
    the others are merged (a sweep that exits 0 has every complete set merged). Under
    torchrun, rank 0 alone merges (each job's ranks finished together, so every job's file is
    there by then).
    """

    def on_multirun_end(self, config, **kwargs) -> None:
        from probe.commands.ranks import from_environment
        from probe.file.merge import ShardsMissing, merge

        ranks = from_environment()
        if ranks is not None and not ranks.leader:
            return

        sweep_dir = Path(str(config.hydra.sweep.dir))
        exclude = [str(k) for k in config.hydra.job.config.override_dirname.exclude_keys]
        failed = []
        for name, shards in shard_groups(sweep_dir, exclude).items():
            out = sweep_dir / f"{name}.h5"
            if out.exists():
                continue
            try:
                merge(out, shards)
            except ShardsMissing as err:
                log.info("not merging the shards of %s: %s", name, err)
            except Exception as err:  # noqa: BLE001  (Hydra would turn it into a warning)
                log.debug("merging the shards of %s", name, exc_info=True)
                why = str(err) if isinstance(err, ProbeError) else f"{type(err).__name__}: {err}"
                failed.append(f"the shards of {name} did not merge ({why}); merge them with "
                              f"python -m probe.merge -o {out} {' '.join(map(str, shards))}")
        for line in failed:
            to_log_files(logging.ERROR, line)
            print(f"probe: error: {line}", file=sys.stderr)
        if failed:  # SystemExit passes through Hydra's callback wrapper; an Exception would not
            sys.exit(1)


def main(argv: Sequence[str] | None = None) -> None:
    from probe.file.merge import __doc__ as doc
    from probe.file.merge import merge

    parser = argparse.ArgumentParser(prog="python -m probe.merge", description=doc.split(
        "\n\n")[0])
    parser.add_argument("-o", "--output", required=True, help="the merged file to write")
    parser.add_argument("shards", nargs="+", help="the shard files (features.h5 of each job)")
    parser.add_argument("--copy", action="store_true",
                        help="write a self-contained file instead of virtual datasets")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    exit_on_user_error(merge)(args.output, args.shards, copy=args.copy, overwrite=args.overwrite)
