"""Structure-aware fuzzing of array containers: a valid npz (or a dict for ``savemat`` / ``torch.save``) whose fields
are mutated, and the tally of what the reader did with each example.

`mutated_arrays` draws from a dict of named arrays: fields dropped, added (unicode names and values), given another
dtype (strings, objects, complex, bool, ints), another shape (an axis more or less, transposed, empty, cut short so
that fields disagree), NaN/inf, huge or negative values. `write_npz` writes the result, optionally with one member's
``.npy`` header claiming an absurd shape (a count the reader must not believe before allocating).
"""

from __future__ import annotations

import io
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from fuzzing import check_read_or_refused
from hypothesis import given
from hypothesis import strategies as st

WEIRD_TEXT = st.sampled_from(["", "é", "能量", "\x00", "eV", "kcal/mol", "Ang", "bohr", "nan", "1e999", "🙂" * 40])
HUGE_COUNTS = [10**12, 2**31, 2**40, 10**6]


def _dtype_change(draw: st.DrawFn, value: np.ndarray) -> np.ndarray:
    kind = draw(st.sampled_from(["str", "bytes", "object", "complex", "bool", "int8", "uint64", "float16"]))
    if kind == "str":
        return np.full(value.shape, draw(WEIRD_TEXT))
    if kind == "bytes":
        return np.full(value.shape, b"x\xff")
    if kind == "object":
        out = np.empty(value.shape if value.ndim else (1,), dtype=object)
        out.fill({"a": 1})
        return out
    if kind == "complex":
        return value.astype(np.complex128) + 1j if value.dtype.kind in "fiub" else value
    with np.errstate(all="ignore"):
        return value.astype(kind) if value.dtype.kind in "fiub" else np.zeros(value.shape, dtype=kind)


def _shape_change(draw: st.DrawFn, value: np.ndarray) -> np.ndarray:
    kind = draw(st.sampled_from(["axis+", "axis-", "transpose", "empty", "short", "scalar", "ravel", "tile"]))
    if kind == "axis+":
        return value[..., None]
    if kind == "axis-" and value.ndim:
        return value[..., 0]
    if kind == "transpose":
        return value.T
    if kind == "empty":
        return value[:0] if value.ndim else np.zeros(0)
    if kind == "short" and value.ndim and len(value) > 1:
        return value[: draw(st.integers(0, len(value) - 1))]
    if kind == "scalar":
        return np.asarray(value.reshape(-1)[0] if value.size else 0)
    if kind == "tile" and value.ndim:
        return np.concatenate([value, value[:1]])
    return value.reshape(-1)


def _value_change(draw: st.DrawFn, value: np.ndarray) -> np.ndarray:
    """NaN/inf, huge, negative or zero values: in one entry or all; an int array may become float to hold a NaN."""
    if value.dtype.kind not in "fiu" or value.size == 0:
        return value
    out = value.copy()
    if value.dtype.kind == "f" or draw(st.booleans()):
        out = out.astype(np.float64)
        special = draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e308, -1e308, -1.0, 0.0, 5e-324]))
    else:
        info = np.iinfo(value.dtype)
        special = draw(
            st.sampled_from(sorted({int(info.max), int(info.min), 0, max(int(info.min), -1), 119 % int(info.max)}))
        )
    flat = out.reshape(-1)
    if draw(st.booleans()):
        flat[:] = special
    else:
        flat[draw(st.integers(0, flat.size - 1))] = special
    return out


@st.composite
def mutated_arrays(draw: st.DrawFn, arrays: Mapping[str, np.ndarray], max_mutations: int = 3) -> dict[str, np.ndarray]:
    """``arrays`` after 1..``max_mutations`` field-level changes (see the module docstring)."""
    out = {key: np.asarray(value) for key, value in arrays.items()}
    for _ in range(draw(st.integers(1, max_mutations))):
        kind = draw(st.sampled_from(["drop", "extra", "dtype", "shape", "shape", "value", "value"]))
        if kind == "extra":
            name = draw(st.sampled_from(["é", "能量", "extra", "R ", "_", "name", "theory", "e_unit", "r_unit"]))
            out[name] = draw(st.sampled_from([np.asarray(draw(WEIRD_TEXT)), np.arange(3.0), np.zeros((2, 0))]))
            continue
        if not out:
            continue
        key = draw(st.sampled_from(sorted(out)))
        if kind == "drop":
            del out[key]
        elif kind == "dtype":
            out[key] = _dtype_change(draw, out[key])
        elif kind == "shape":
            out[key] = _shape_change(draw, out[key])
        else:
            out[key] = _value_change(draw, out[key])
    return out


def write_npz(path: Path, arrays: Mapping[str, np.ndarray], lie: tuple[str, tuple[int, ...]] | None = None) -> None:
    """``np.savez`` of ``arrays`` (object arrays pickled, as numpy does by default); ``lie`` = (field, shape): that
    member's ``.npy`` header claims ``shape`` while its data stay as they were."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    if lie is None or lie[0] not in arrays:
        path.write_bytes(buffer.getvalue())
        return
    name, shape = lie
    with zipfile.ZipFile(buffer) as source, zipfile.ZipFile(path, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == f"{name}.npy":
                value = np.asarray(arrays[name])
                header = {"descr": np.lib.format.dtype_to_descr(value.dtype), "fortran_order": False, "shape": shape}
                member = io.BytesIO()
                np.lib.format.write_array_header_1_0(member, header)
                data = member.getvalue() + value.tobytes()
            target.writestr(info.filename, data)


@st.composite
def npz_examples(draw: st.DrawFn, arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Any]:
    """(mutated arrays, header lie or None): one in five examples has a member whose header claims a huge count."""
    content = draw(mutated_arrays(arrays))
    lie = None
    if content and draw(st.integers(0, 4)) == 0:
        name = draw(st.sampled_from(sorted(content)))
        ndim = max(np.asarray(content[name]).ndim, 1)
        lie = (name, tuple(draw(st.sampled_from(HUGE_COUNTS)) if i == 0 else 3 for i in range(ndim)))
    return content, lie


class Tally:
    """What a fuzz test's reader did with its examples: read, or refused (at the container or a deeper check)."""

    def __init__(self, first_gate: tuple[str, ...]):
        self.first_gate = first_gate
        self.counts: Counter[str] = Counter()

    def add(self, result: Any, message: str = "") -> None:
        """``result``: what the read returned (an int: how many bad records it skipped), None when refused."""
        if result is not None:
            self.counts["read"] += 1
            if isinstance(result, int) and result > 0:
                self.counts["read, records skipped"] += 1
        elif any(text in message for text in self.first_gate):
            self.counts["refused at the container"] += 1
        else:
            self.counts["refused deeper"] += 1

    def __repr__(self) -> str:
        return ", ".join(
            f"{key} {self.counts[key]}"
            for key in ("read", "read, records skipped", "refused at the container", "refused deeper")
        )


def fuzz_reader(
    settings_: Callable, strategy: st.SearchStrategy, write: Callable[[Any], tuple[Callable[[], Any], list]],
    first_gate: tuple[str, ...], label: str,
) -> Tally:  # fmt: skip
    """Run ``settings_``-many examples of ``strategy``: ``write(example)`` lays the files out and returns (read, names
    the error may cite); each read must keep `check_read_or_refused`'s contract. Prints and returns the tally."""
    from workbench.core.errors import UserError

    tally = Tally(first_gate)

    @settings_
    @given(strategy)
    def run(example: Any) -> None:
        read, names = write(example)
        messages: list[str] = []

        def recorded() -> Any:
            try:
                return read()
            except UserError as error:
                messages.append(str(error))
                raise

        tally.add(check_read_or_refused(recorded, *names), messages[0] if messages else "")

    run()
    print(f"fuzz {label}: {tally}")
    return tally
