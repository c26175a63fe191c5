"""A DICOM file's header read within a budget: the one bounded DICOM reading the server's checks
(`workbench.serve.limits`) and the image readers share, so ``workbench serve`` and ``workbench predict`` refuse the
same files.

pydicom inflates a deflated dataset (transfer syntax Deflated Explicit VR Little Endian, 1.2.840.10008.1.2.1.99) in
full, in memory, before it reads a single element, even with ``stop_before_pixels``: a file of 1 MB can inflate to
1 GB. `read_header` never does: it reads the file meta group as it is stored, then inflates the dataset with
``zlib.decompressobj().decompress(data, max_length)`` in chunks of `CHUNK` bytes, the header from its first
`HEADER_BYTES` inflated bytes, and counts the rest against a budget derived from the pixels the header declares
(rows × columns × frames × samples per pixel × bytes per sample + `HEADER_BYTES`), refusing past it. A dataset that
passes has an inflated size within that budget, so the pixel reader that follows (pydicom, MONAI) is bounded too.
Other transfer syntaxes are read by pydicom with ``stop_before_pixels`` (the pixel data is not read), or with a
caller's reader that checks every element's length and values above `CHUNK` deferred.
"""

from __future__ import annotations

import io
import math
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from workbench.core.errors import UserError

#: The deflated transfer syntax's UID.
DEFLATED = "1.2.840.10008.1.2.1.99"
#: Inflated bytes read for the header of a deflated dataset, and the slack allowed beside its pixel data [bytes].
HEADER_BYTES = 4 << 20
#: Compressed bytes fed to the inflater at a time, and the most inflated bytes taken from one call [bytes].
CHUNK = 1 << 20
_PIXEL_DATA = 0x7FE00010


class DicomRefused(UserError):
    """A DICOM file refused before its pixels are read: ``problem`` says why (without the path); ``too_large`` is
    True when it asks for more than the budget (an HTTP server answers 413), False when it is malformed (422);
    ``shape`` (rows, columns, frames) when its header declared more pixels than allowed."""

    def __init__(self, path: Path, problem: str, too_large: bool, shape: tuple[int, int, int] | None = None):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem, self.too_large, self.shape = Path(path), problem, too_large, shape


def pixels_of(header: Any) -> int:
    """Rows × columns × frames the header declares (0 when it has no rows or columns)."""
    rows, columns = int(header.get("Rows") or 0), int(header.get("Columns") or 0)
    return rows * columns * int(header.get("NumberOfFrames") or 1)


def pixel_bytes(header: Any) -> int:
    """Bytes of the pixel data the header declares: pixels × samples per pixel × bytes per sample."""
    samples = max(1, int(header.get("SamplesPerPixel") or 1))
    return pixels_of(header) * samples * max(1, math.ceil(int(header.get("BitsAllocated") or 8) / 8))


def read_header(path: str | Path, max_pixels: int, source: BinaryIO | None = None) -> Any:
    """The header (a pydicom ``Dataset`` without its pixel data) of the DICOM file ``path``, checked against
    ``max_pixels`` (rows × columns × frames) and, for a deflated dataset, against the inflation budget (module
    docstring).

    Args:
        path: the file.
        max_pixels: the most pixels accepted.
        source: the file opened by the caller (a reader that checks element lengths as it reads: then the pixel
            data element is parsed too, its value deferred, so its length is checked); None opens ``path`` and stops
            before the pixel data. Used for transfer syntaxes other than the deflated one.

    Raises:
        DicomRefused: above ``max_pixels`` or the budget (``too_large``), or not a readable DICOM file.
    """
    import pydicom
    from pydicom import filereader

    path = Path(path)
    try:
        with open(path, "rb") as handle:
            filereader.read_preamble(handle, False)
            meta = filereader._read_file_meta_info(handle)
            deflated = str(meta.get("TransferSyntaxUID", "")) == DEFLATED
            if deflated:
                header = _inflated_header(path, handle, max_pixels)
    except DicomRefused:
        raise
    except Exception as error:  # pydicom raises many kinds for a malformed file
        raise DicomRefused(path, f"not a readable DICOM file ({type(error).__name__}: {error})", False) from None
    if not deflated:
        try:
            header = pydicom.dcmread(source or path, stop_before_pixels=source is None, defer_size=CHUNK)
        except Exception as error:
            if source is not None:  # the caller's reader: its own refusals pass through
                raise
            raise DicomRefused(path, f"not a readable DICOM file ({type(error).__name__}: {error})", False) from None
        _check_pixels(path, header, max_pixels)
    return header


def _check_pixels(path: Path, header: Any, max_pixels: int) -> None:
    pixels = pixels_of(header)
    if pixels > max_pixels:
        shape = (int(header.get("Rows") or 0), int(header.get("Columns") or 0), int(header.get("NumberOfFrames") or 1))
        raise DicomRefused(path, f"an image of {pixels:,} pixels, above the limit of {max_pixels:,}", True, shape)


def _inflated_header(path: Path, handle: BinaryIO, max_pixels: int) -> Any:
    """The header of a deflated dataset (``handle`` just after the file meta group), its whole inflated size
    counted against the budget."""
    from pydicom import filereader

    chunks = _inflated(handle)
    head = bytearray()
    for chunk in chunks:
        head += chunk
        if len(head) >= HEADER_BYTES:
            break
    header = filereader.read_dataset(io.BytesIO(bytes(head)), is_implicit_VR=False, is_little_endian=True,
                                     stop_when=lambda tag, vr, length: tag == _PIXEL_DATA)  # fmt: skip
    if not header.get("Rows") and len(head) >= HEADER_BYTES:
        raise DicomRefused(path, f"no image header in the first {HEADER_BYTES >> 20} MiB of its inflated dataset",
                           True)  # fmt: skip
    _check_pixels(path, header, max_pixels)
    budget, total = pixel_bytes(header) + HEADER_BYTES, len(head)
    del head
    for chunk in chunks:
        total += len(chunk)
        if total > budget:
            raise DicomRefused(path, f"its deflated dataset inflates past {budget:,} bytes, more than the "
                                     f"{pixel_bytes(header):,} bytes of pixels its header declares and "
                                     f"{HEADER_BYTES >> 20} MiB besides (a decompression bomb?)", True)  # fmt: skip
    return header


def _inflated(handle: BinaryIO) -> Iterator[bytes]:
    """The raw deflate stream from ``handle`` inflated, at most `CHUNK` bytes per piece (never an unbounded
    ``decompress``)."""
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    pending = b""
    while not inflater.eof:
        if not pending:
            pending = handle.read(CHUNK)
            if not pending:
                return
        out = inflater.decompress(pending, CHUNK)
        pending = inflater.unconsumed_tail
        if out:
            yield out
