"""The run: from a composed config to a finished file.

    probe.pipeline.plan       everything that can fail, decided before a file exists
    probe.pipeline.execute    the loop: forward (and backward), captures handed to the writer
    probe.pipeline.hooks      the hooks, owned by a context manager (probe.attach)
    probe.pipeline.keys       what each stored key becomes (pool, reduce, cast)
    probe.pipeline.dryrun     one sample through the model: every key's shape
    probe.pipeline.listing    what python -m probe.layers lists

and what they use: build (the config's model and dataset), modules (layer names and globs),
reduce, objectives, device, fingerprint (what a file was made from), shards (torchrun ranks).
"""
