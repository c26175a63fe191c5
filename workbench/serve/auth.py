"""Who may call the served model: bearer tokens, each with the caller id the audit log records.

Tokens come from a file (``--token-file``) or, without one, from the environment variable `TOKENS_VARIABLE`; both
hold ``caller_id token`` pairs, one per line (``;`` also separates pairs in the variable; a ``#`` at the start of a
line or after a space starts a comment; a token containing ``#`` is refused, as one that is not printable ASCII).
A token has at least `MIN_TOKEN_CHARS` characters (``python -c "import secrets; print(secrets.token_urlsafe())"``
makes one); caller ids and tokens are unique. A request names its token as ``Authorization: Bearer <token>``; it is
compared with every known token by `hmac.compare_digest` (no early exit, so the time taken does not tell how much of
a guess was right). A header that is not ASCII names no known token.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import stat
from pathlib import Path

from workbench.core.errors import UserError

log = logging.getLogger("workbench")

#: The environment variable read when no token file is given.
TOKENS_VARIABLE = "WORKBENCH_SERVE_TOKENS"
#: The shortest token accepted [characters].
MIN_TOKEN_CHARS = 16
_CALLER = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")


class Tokens:
    """Caller ids by token; `caller` tells who sent an ``Authorization`` header (None: nobody known).

    Args:
        pairs: ``(caller_id, token)`` pairs, checked (`parse_tokens` makes them from text).
    """

    def __init__(self, pairs: list[tuple[str, str]]):
        self._pairs = [(caller, token.encode()) for caller, token in pairs]

    def caller(self, authorization: str | None) -> str | None:
        """The caller id of ``authorization`` (the header's value, ``Bearer <token>``), None when it is missing,
        malformed or names no known token."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        if not token.isascii():  # every known token is ASCII
            return None
        given = token.strip().encode()
        found = None
        for caller, known in self._pairs:
            if hmac.compare_digest(given, known):
                found = caller
        return found


def parse_tokens(text: str, where: str) -> Tokens:
    """`Tokens` from ``caller_id token`` lines (or ``;``-separated pairs); ``where`` names the source in errors.

    Raises:
        UserError: a malformed pair, a short or repeated token, a repeated or malformed caller id, or no pair at all.
    """
    pairs: list[tuple[str, str]] = []
    for number, raw in enumerate(re.split(r"[\n;]", text), start=1):
        line = re.split(r"(?:^|\s)#", raw, maxsplit=1)[0].strip()
        if not line:
            continue
        words = line.split()
        if len(words) != 2:
            raise UserError(f"{where}: entry {number}: expected 'caller_id token' (two words), found {len(words)} "
                            "word(s)")  # fmt: skip
        caller, token = words
        if not _CALLER.match(caller):
            raise UserError(f"{where}: entry {number}: caller id {caller!r}: expected 1-64 letters, digits or ._@-")
        if not (token.isascii() and token.isprintable()) or "#" in token:
            raise UserError(f"{where}: entry {number} ({caller}): the token has a character other than printable ASCII "
                            "without '#' (a header can carry only those, and '#' may be taken for a comment); make "
                            "one with: python -c \"import secrets; print(secrets.token_urlsafe())\"")  # fmt: skip
        if len(token) < MIN_TOKEN_CHARS:
            raise UserError(f"{where}: entry {number} ({caller}): token of {len(token)} characters, expected at least "
                            f"{MIN_TOKEN_CHARS}; make one with: python -c \"import secrets; "
                            "print(secrets.token_urlsafe())\"")  # fmt: skip
        if any(caller == other for other, _ in pairs):
            raise UserError(f"{where}: entry {number}: caller id {caller!r} given twice")
        if any(token == other for _, other in pairs):
            raise UserError(f"{where}: entry {number} ({caller}): the same token as another caller; give each its own")
        pairs.append((caller, token))
    if not pairs:
        raise UserError(f"{where}: no 'caller_id token' pair")
    return Tokens(pairs)


def load_tokens(token_file: str | Path | None) -> Tokens:
    """The tokens of ``token_file``, else of the environment variable `TOKENS_VARIABLE`.

    Raises:
        UserError: neither is given, the file cannot be read, or its content is refused (`parse_tokens`).
    """
    if token_file is None:
        text = os.environ.get(TOKENS_VARIABLE, "")
        if not text.strip():
            raise UserError(f"no tokens: give --token-file FILE (lines 'caller_id token') or set {TOKENS_VARIABLE}; "
                            "the server answers no request without a bearer token")  # fmt: skip
        return parse_tokens(text, f"${TOKENS_VARIABLE}")
    path = Path(token_file)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"--token-file {path}: cannot be read ({error})") from None
    if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("--token-file %s: readable by other users; chmod 600 %s", path, path)
    return parse_tokens(text, f"--token-file {path}")
