"""Fuzzing readers: byte-level mutations of real files, and the contract every reader keeps on them.

The contract (`check_read_or_refused`): a mutated input is either read, or refused with the project's
`UserError` whose message names the file; never another exception (a traceback), never longer than a time
limit (a hang), never more memory than a limit (a count in a header believed before allocating).

Examples per test: ``FUZZ_EXAMPLES`` in the default suite (the hypothesis profile "ci"); the ``slow`` tests
use ``DEEP_EXAMPLES`` (run ``pytest -m slow -k fuzz``). Every profile is derandomized: a failure reproduces.
"""

from __future__ import annotations

import contextlib
import resource
import signal
from pathlib import Path
from typing import Any, Callable, Iterator

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from workbench.core.errors import UserError

#: Examples per reader in the default suite, and in the slow ``-k fuzz`` run.
FUZZ_EXAMPLES = 20
DEEP_EXAMPLES = 400

#: What one read may take: wall seconds, and address space above what the process holds before it [bytes].
TIME_LIMIT_S = 20
MEMORY_LIMIT_BYTES = 2 * 1024**3

_COMMON = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)
fuzz = settings(max_examples=FUZZ_EXAMPLES, **_COMMON)
deep = settings(max_examples=DEEP_EXAMPLES, **_COMMON)


class Hang(BaseException):
    """A read ran past `TIME_LIMIT_S` (a BaseException: a reader's ``except Exception`` must not turn it into a
    refusal)."""


@st.composite
def mutated(draw: st.DrawFn, original: bytes, max_mutations: int = 3) -> bytes:
    """``original`` after 1..``max_mutations`` of: truncation, flipped bits, overwritten bytes (random, 0x00, 0xFF,
    ASCII digits: absurd counts in text headers), inserted or deleted bytes, a duplicated chunk."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, max_mutations))):
        size = len(data)
        kind = draw(st.sampled_from(["truncate", "flip", "overwrite", "digits", "insert", "delete", "duplicate"]))
        at = draw(st.integers(0, max(size - 1, 0)))
        if kind == "truncate":
            del data[at:]
        elif kind == "flip" and size:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "overwrite" and size:
            fill = draw(st.sampled_from([b"\x00", b"\xff", None]))
            length = draw(st.integers(1, 16))
            chunk = fill * length if fill else draw(st.binary(min_size=length, max_size=length))
            data[at : at + length] = chunk
        elif kind == "digits" and size:
            digits = draw(st.sampled_from([b"9" * 12, b"-1", b"0", b"nan", b"inf", b"1e308"]))
            data[at : at + len(digits)] = digits
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=32))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 64))]
        elif kind == "duplicate" and size:
            data[at:at] = data[at : at + draw(st.integers(1, 256))]
    return bytes(data)


@contextlib.contextmanager
def limits(seconds: float = TIME_LIMIT_S, memory_bytes: int = MEMORY_LIMIT_BYTES) -> Iterator[None]:
    """Raise `Hang` after ``seconds`` (SIGALRM: main thread, Unix) and cap the address space at what the process
    maps now plus ``memory_bytes`` (an allocation past it fails: MemoryError from NumPy, RuntimeError from torch)."""
    previous_handler = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(Hang()))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    mapped = _mapped_bytes()
    cap = mapped + memory_bytes if hard == resource.RLIM_INFINITY else min(hard, mapped + memory_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, previous_handler)


def _mapped_bytes() -> int:
    """The process's virtual memory size [bytes] (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def check_read_or_refused(read: Callable[[], Any], *names: str | Path) -> Any:
    """Run ``read()`` under `limits`; return what it read, or None when it raised a `UserError` naming one of
    ``names`` (a file or folder the user gave). Any other outcome fails the test with what happened."""
    try:
        with limits():
            return read()
    except UserError as error:
        cause = error.__context__
        while cause is not None:  # a refusal made of an allocation failure: the count was believed first
            if isinstance(cause, MemoryError):
                raise AssertionError(f"the read of {list(map(str, names))} hit MemoryError, then said: {error}")
            cause = cause.__context__
        message = str(error)
        wanted = [str(name) for name in names] + [Path(name).name for name in names]
        assert any(name in message for name in wanted), f"the error names none of {list(map(str, names))}: {message}"
        return None
    except Hang:
        raise AssertionError(f"the read of {list(map(str, names))} ran past {TIME_LIMIT_S} s") from None
    except MemoryError:
        raise AssertionError(
            f"the read of {list(map(str, names))} tried to allocate past {MEMORY_LIMIT_BYTES / 2**30:.0f} GiB more "
            "(a count believed before checking it)"
        ) from None
