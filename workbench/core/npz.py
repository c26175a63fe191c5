"""Reading a user's ``.npz`` safely: no pickle is ever loaded, and no array header is believed before it is checked.

`load_npz` is the one place every reader opens an npz. Each member's ``.npy`` header is read first: an object array
(a pickle) is refused, and so is a header whose shape claims more bytes than the member holds (a damaged or hostile
count, which numpy would otherwise allocate before finding the data short). Anything else wrong with the container
(not a zip, a bad CRC, a truncated member) is a `UserError` naming the file.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from workbench.core.errors import UserError, field_error

#: numpy's readers of the ``.npy`` header versions that ``np.save`` writes for numeric and text arrays.
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
#: The most a deflated stream can expand (zlib's limit, about 1032:1).
_DEFLATE_MAX_RATIO = 1032


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of the npz at ``path`` by field name; a `UserError` naming the file (and field) otherwise."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.filename.endswith(".npy"):
                    _check_header(path, archive, info)
        with np.load(path, allow_pickle=False) as content:
            return {key: content[key] for key in content.files}
    except UserError:
        raise
    except Exception as error:  # zipfile, zlib and numpy raise many kinds for a damaged file
        raise UserError(f"{path}: not a readable npz file ({type(error).__name__}: {error})") from None


def _check_header(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
    """Refuse a member that is a pickle or whose header claims more data than the member's size."""
    field = info.filename[: -len(".npy")]
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version not in _HEADER_READERS:
            raise field_error(path, field, "an .npy member of format version 1.0 or 2.0", f"version {version}")
        shape, _, dtype = _HEADER_READERS[version](member)
        header_bytes = member.tell()
    if dtype.hasobject:
        raise field_error(path, field, "a numeric or text array", "an object array (a pickle, never loaded)")
    claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
    # a stored member holds exactly its compressed size; deflate expands at most 1032 times
    most = info.compress_size * (1 if info.compress_type == zipfile.ZIP_STORED else _DEFLATE_MAX_RATIO)
    held = min(info.file_size, most) - header_bytes
    if claimed > held:
        raise field_error(
            path, field, f"data for the shape {list(shape)} in its header ({claimed} bytes)", f"{held} bytes"
        )
