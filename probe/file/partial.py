"""A partial file that a kill at any instruction leaves readable.

A run writes ``<path>.partial`` in HDF5's single-writer/multiple-reader (SWMR) mode. SWMR orders
every metadata write so that the file on disk is consistent at all times: a reader that opens
it mid-write sees the state of some earlier moment, never a pointer into unwritten space. A
process killed at any instruction leaves exactly such a moment behind, so what was committed
can always be read back. The superblock is what SWMR leaves out of date, and ``recover``
repairs it before the next writer opens the file, as HDF5's own ``h5clear --status
--increment=0`` does for a crashed SWMR writer:

- its status flags still say "open for writing", which makes every ordinary open fail;
- its end-of-file address may lag behind the space the writer had since allocated and
  written (HDF5 would then allocate over it), or lie past the file's end (space reserved but
  never written, which HDF5 refuses as a truncated file).

``open_for_reading`` opens a partial file in whatever state its writer left it, without
changing it. Files in this format need HDF5 1.10 or newer (``LIBVER``), as MATLAB, Julia and R
have shipped for years.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py

__all__ = ["LIBVER", "open_for_reading", "open_for_writing", "recover", "status_flags",
           "lookup3"]

# The file format of HDF5 1.10, the first with SWMR: superblock version 3, whose status flags
# say whether a writer has the file open. Bounded above too, so that every file is readable
# by HDF5 1.10 (Debian 12's hdf5-tools, MATLAB).
LIBVER = ("v110", "v110")

_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_MASK = 0xFFFFFFFF


def open_for_reading(path: Path, locking: bool | str | None = None, **options) -> h5py.File:
    """``path`` opened read-only: normally, or, where a writer has it open (or was killed with
    it open), as a SWMR reader, which sees its last consistent state.

    Raises:
        OSError: the file is not a readable HDF5 file.
    """
    try:
        return h5py.File(path, "r", locking=locking, **options)
    except OSError as err:
        if "open for write" not in str(err):
            raise
        return h5py.File(path, "r", locking=locking, swmr=True, **options)


def open_for_writing(path: Path, locking: bool | str | None = None, *, rdcc_nbytes: int = 0,
                     rdcc_w0: float = 1.0) -> h5py.File:
    """A partial file opened for appending, in SWMR mode, after the repairs that a killed
    writer leaves to the next one (see the module's docstring). The file is opened for SWMR
    writing in one step, so that it is never open for plain writing, even for an instant.

    Args:
        locking: HDF5's file locking, as ``h5py.File`` takes it.
        rdcc_nbytes, rdcc_w0: the chunk cache, as ``h5py.File`` takes it.

    Raises:
        OSError: the file is not an HDF5 file of this format.
    """
    recover(path)
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_V110, h5py.h5f.LIBVER_V110)
    _, slots, _, _ = fapl.get_cache()
    fapl.set_cache(0, slots, rdcc_nbytes, rdcc_w0)
    if locking is not None:
        fapl.set_file_locking(locking is not False, locking == "best-effort")
    flags = h5py.h5f.ACC_RDWR | h5py.h5f.ACC_SWMR_WRITE
    return h5py.File(h5py.h5f.open(os.fsencode(path), flags, fapl=fapl))


def status_flags(path: Path) -> int:
    """The superblock's file consistency flags (0 when no writer has the file open)."""
    return _superblock(path)[11]


def recover(path: Path) -> None:
    """Repair the superblock that a killed SWMR writer left (see the module's docstring):
    clear its status flags, make its end-of-file address cover every byte of the file, and
    extend the file to that address. Only for a file that no process has open; a file closed
    cleanly is left as it is.

    Raises:
        OSError: not a file with a version 2 or 3 superblock at its start.
    """
    block = bytearray(_superblock(path))
    size = block[9]
    where = slice(12 + 2 * size, 12 + 3 * size)
    recorded = int.from_bytes(block[where], "little")
    length = os.path.getsize(path)
    if block[11] == 0 and recorded == length:
        return
    end = max(recorded, length)
    if length < end:  # reserved but never written: zeros, which nothing committed points into
        os.truncate(path, end)
    block[11] = 0
    block[where] = end.to_bytes(size, "little")
    checked = _checksummed_length(block)
    block[checked:checked + 4] = lookup3(bytes(block[:checked])).to_bytes(4, "little")
    with open(path, "r+b") as stream:
        stream.write(block[:checked + 4])  # one write, in the file's first page


def _superblock(path: Path) -> bytes:
    with open(path, "rb") as stream:
        block = stream.read(48)
    if len(block) < 12 or block[:8] != _SIGNATURE or block[8] not in (2, 3):
        raise OSError(f"{str(path)!r} does not start with an HDF5 1.10 superblock")
    if len(block) < _checksummed_length(block) + 4:
        raise OSError(f"{str(path)!r} ends inside its superblock")
    return block


def _checksummed_length(block: bytes | bytearray) -> int:
    # signature, versions and sizes, flags, then four addresses of `size of offsets` bytes
    return 12 + 4 * block[9]


def lookup3(data: bytes, initval: int = 0) -> int:
    """Bob Jenkins' lookup3 hash (``hashlittle``), HDF5's checksum of its metadata."""
    length = len(data)
    a = b = c = (0xDEADBEEF + length + initval) & _MASK
    k = 0
    while length > 12:
        a = (a + int.from_bytes(data[k:k + 4], "little")) & _MASK
        b = (b + int.from_bytes(data[k + 4:k + 8], "little")) & _MASK
        c = (c + int.from_bytes(data[k + 8:k + 12], "little")) & _MASK
        a, b, c = _mix(a, b, c)
        length -= 12
        k += 12
    if length == 0:
        return c
    tail = data[k:k + length] + bytes(12 - length)
    a = (a + int.from_bytes(tail[0:4], "little")) & _MASK
    b = (b + int.from_bytes(tail[4:8], "little")) & _MASK
    c = (c + int.from_bytes(tail[8:12], "little")) & _MASK
    return _final(a, b, c)


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _MASK


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    for shift_a, shift_b, shift_c in ((4, 6, 8), (16, 19, 4)):
        a = ((a - c) & _MASK) ^ _rot(c, shift_a)
        c = (c + b) & _MASK
        b = ((b - a) & _MASK) ^ _rot(a, shift_b)
        a = (a + c) & _MASK
        c = ((c - b) & _MASK) ^ _rot(b, shift_c)
        b = (b + a) & _MASK
    return a, b, c


def _final(a: int, b: int, c: int) -> int:
    for shifts in ((14, 11, 25), (16, 4, 14)):
        c = ((c ^ b) - _rot(b, shifts[0])) & _MASK
        a = ((a ^ c) - _rot(c, shifts[1])) & _MASK
        b = ((b ^ a) - _rot(a, shifts[2])) & _MASK
    return ((c ^ b) - _rot(b, 24)) & _MASK
