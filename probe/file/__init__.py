"""The file: its format, how it is written, read and merged.

    probe.file.format    dataset and attribute names, what makes a file complete
    probe.file.store     chunked, resizable HDF5 datasets, committed and resumable
    probe.file.writer    the thread between the compute loop and the store
    probe.file.partial   the partial file that a kill at any instruction leaves readable
    probe.file.output    where the file goes, what a run finds there, one writer a file
    probe.file.read      probe.open; probe.file.rows streams a dataset's rows in batches
    probe.file.merge     shard files joined into one
"""
