"""The keys that sign and verify seals (`workbench.core.seal`): ed25519, from the ``cryptography`` package.

The private key (PEM, PKCS#8, unencrypted) lives outside every run folder. Where, in order of precedence:

1. ``--seal-key PATH`` of the command (`key_in_use`: it sets ``WORKBENCH_SEAL_KEY`` while the command runs, for the
   worker processes it starts too);
2. the environment variable ``WORKBENCH_SEAL_KEY``;
3. ``$XDG_CONFIG_HOME/workbench/seal-key.pem`` (``~/.config/workbench/seal-key.pem`` when ``XDG_CONFIG_HOME`` is unset).

It is created on first use by a writer (mode 0600, its folder 0700 when made here, written to a temporary name and
linked into place, so that two processes never sign with two keys). Readers never create it.

Trusted public keys: the key's own public key (when it exists) and every line ``NAME BASE64-PUBLIC-KEY`` of
``$XDG_CONFIG_HOME/workbench/trusted-seal-keys`` (``#`` starts a comment): a team shares verification by sharing
those lines, never the private key. A key is named by its `key_id`: the first 16 hex digits of sha256 of its 32 raw
bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from workbench.core.errors import UserError

#: The environment variable naming the private key's file.
KEY_ENV = "WORKBENCH_SEAL_KEY"
#: The flag naming it on the command line.
KEY_FLAG = "--seal-key"
#: The file of trusted public keys, in the workbench's configuration folder.
TRUSTED_NAME = "trusted-seal-keys"

def config_folder() -> Path:
    """``$XDG_CONFIG_HOME/workbench`` (``~/.config/workbench`` when the variable is unset or empty)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "workbench"


@contextmanager
def key_in_use(path: str | Path | None) -> Iterator[None]:
    """Sign and verify with the key in ``path`` while the block runs (``--seal-key``), in this process and the worker
    processes it starts (it sets ``WORKBENCH_SEAL_KEY``, and sets it back after); None: nothing changes."""
    if path is None:
        yield
        return
    before = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = str(Path(path).expanduser().absolute())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(KEY_ENV, None)
        else:
            os.environ[KEY_ENV] = before


#: The key `use_key` chose for this process (None: the environment's, or the default).
_chosen: dict[str, Path | None] = {"path": None}


def use_key(path: str | Path | None) -> None:
    """Sign and verify with the key in ``path`` in this process from now on (None: back to ``$WORKBENCH_SEAL_KEY``
    and the default). Worker processes do not see it: a command line uses `key_in_use`."""
    _chosen["path"] = None if path is None else Path(path).expanduser().absolute()


def key_path() -> Path:
    """The private key's file: `use_key`'s, else ``$WORKBENCH_SEAL_KEY`` (which ``--seal-key`` sets, `key_in_use`),
    else ``config_folder()/seal-key.pem``."""
    if _chosen["path"] is not None:
        return _chosen["path"]
    given = os.environ.get(KEY_ENV)
    return Path(given).expanduser().absolute() if given else config_folder() / "seal-key.pem"


def trusted_path() -> Path:
    """The file of trusted public keys: ``config_folder()/trusted-seal-keys``."""
    return config_folder() / TRUSTED_NAME


def raw_public(key: Ed25519PublicKey) -> bytes:
    """The 32 raw bytes of a public key."""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(raw: bytes) -> str:
    """The name of a public key in messages: the first 16 hex digits of sha256 of its 32 raw bytes."""
    return hashlib.sha256(raw).hexdigest()[:16]


def encode(raw: bytes) -> str:
    """Raw bytes as base64 text (a seal's ``public_key`` and ``signature``, a trusted-keys line)."""
    return base64.b64encode(raw).decode("ascii")


def decode(text: object, what: str) -> bytes:
    """The bytes of base64 ``text``; a `ValueError` naming ``what`` when it is not base64."""
    if not isinstance(text, str):
        raise ValueError(f"its {what} is not base64 text")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError(f"its {what} is not base64 text") from None


def _read_private(path: Path) -> Ed25519PrivateKey:
    """The ed25519 private key in ``path``; a `UserError` naming the file and the fix when it cannot be read."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except OSError as error:
        raise UserError(f"seal key {path}: cannot be read ({error.strerror}); give a readable key with {KEY_FLAG} "
                        f"or {KEY_ENV}, or remove it to make a new one") from None  # fmt: skip
    except (ValueError, TypeError):
        raise UserError(f"seal key {path}: not an unencrypted PEM private key; give another with {KEY_FLAG} or "
                        f"{KEY_ENV}") from None  # fmt: skip
    if not isinstance(key, Ed25519PrivateKey):
        raise UserError(f"seal key {path}: a {type(key).__name__}, not an ed25519 key; give an ed25519 key")
    return key


def _create(path: Path) -> None:
    """A new private key in ``path`` (0600; its folder 0700 when made here), linked into place: when another process
    made one first, its key stays."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, mode=0o700)
        path.parent.chmod(0o700)
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(handle, 0o600)
        with os.fdopen(handle, "wb") as file:
            file.write(pem)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(temporary, path)  # never over a key another process made meanwhile
        except FileExistsError:
            pass
    finally:
        os.unlink(temporary)


def signing_key(create: bool = True) -> Ed25519PrivateKey | None:
    """The private key of `key_path` (made when missing and ``create``; None when missing and not ``create``).

    Raises:
        UserError: the file exists but cannot be read, or is not an ed25519 PEM key; or it cannot be made.
    """
    path = key_path()
    if not path.exists():
        if not create:
            return None
        try:
            _create(path)
        except OSError as error:
            raise UserError(f"seal key {path}: cannot be made ({error.strerror}); give a writable place with "
                            f"{KEY_FLAG} or {KEY_ENV}") from None  # fmt: skip
    return _read_private(path)


def trusted_keys() -> dict[str, str]:
    """key_id -> a name, of every trusted public key: this machine's own (``own key``, when it exists) and each line
    of `trusted_path`.

    Raises:
        UserError: a line of the trusted-keys file is not ``NAME BASE64-PUBLIC-KEY`` (naming the file and line).
    """
    trusted = {}
    own = signing_key(create=False)
    if own is not None:
        trusted[key_id(raw_public(own.public_key()))] = f"own key ({key_path()})"
    path = trusted_path()
    if not path.is_file():
        return trusted
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        try:
            if len(words) != 2:
                raise ValueError("expected two words")
            raw = decode(words[1], "public key")
            Ed25519PublicKey.from_public_bytes(raw)
        except ValueError as error:
            raise UserError(f"{path} line {number}: not 'NAME BASE64-PUBLIC-KEY' ({error}); fix or remove that "
                            "line") from None  # fmt: skip
        trusted[key_id(raw)] = words[0]
    return trusted


def public_parts(key: Ed25519PrivateKey) -> tuple[str, str]:
    """(key_id, public key as base64) of a private key."""
    raw = raw_public(key.public_key())
    return key_id(raw), encode(raw)


def sign(key: Ed25519PrivateKey, message: bytes) -> str:
    """The ed25519 signature of ``message`` by ``key``, as base64."""
    return encode(key.sign(message))


def signature_holds(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is the ed25519 signature of ``message`` by ``public_key`` (raw bytes)."""
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True
