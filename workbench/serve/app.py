"""The served model: a FastAPI app around a loaded `workbench.clinical.predictor.ClinicalPredictor`.

Routes:

- ``POST /predict``: one record, either as a multipart upload of its files in the task's own format (form fields
  other than files, a question say, are stored as ``<field>.txt`` beside them) or as a JSON body
  ``{"path": "<relative path inside the intake folder>"}``. Answers ``{"request_id", "input_sha256", "model",
  "results": [one dict per scored item: record, status, labels, probabilities, conformal_set, shift, ...]}``.
- ``GET /model``: the predictor's ``describe()`` (task, method, hashes, version, calibration, conformal, shift,
  intended use).
- ``GET /audit/head``: the audit log's head (line count and last line's sha256), freshly signed
  (`workbench.serve.audit_head`), and where the server writes its signed heads.
- ``GET /dashboard``: the monitoring page (`workbench.serve.dashboard`): requests, shift p-values, conformal sets and
  calibrated probabilities over time from the audit log's last lines, the audit head, the run's card summary.
- ``GET /health``: ``{"status": "ok"}`` without a token; 503 while shutting down, and 503 ``{"status":
  "unhealthy", "reason"}`` once the audit log cannot be written.

Every route but ``/health`` needs ``Authorization: Bearer <token>`` (`workbench.serve.auth`; 401 otherwise).
Refusals are one-line JSON messages (``{"detail": ..., "request_id": ...}``), never a stack trace: 400 a malformed
request (a body that ends at another length than its ``Content-Length``, a NUL in an intake path, JSON nested too
deeply), 404 an intake path that names nothing, 408 a body not received in time, 411 no ``Content-Length``, 413
above a limit (`workbench.serve.limits`: the body counted on the bytes received, whatever ``Content-Length`` or
``Transfer-Encoding`` say, cut there with ``Connection: close`` and not read further; a file's header checked in a
worker process within its memory, CPU and wall budgets, `workbench.serve.decoding`), 415 neither multipart nor JSON,
422 a record the task's reader refuses (its own message) or a header whose extent cannot be told, 499 (audited and
logged, no traceback) a client that disconnected before its answer, 504 no answer within ``timeout_s``, 500 a fault
of the server (logged with its traceback, the client gets the request id). Each caller's answers depend on its own
requests only (`ClinicalPredictor.answer`'s ``caller``).

Every ``/predict`` request that passed the token check, answered or refused, gets one audit line
(`workbench.serve.audit`), written and synced before the response is sent; when it cannot be written the client gets
503 and no answer, and so does every later request, with that one reason (a restart quarantines a torn last line:
`workbench.serve.audit.AuditLog`). With ``--trust-modified`` each audit line records what differed from
the run's seal (``run_seal``).

While draining (`Gate.draining`, set by the first SIGTERM or Ctrl-C in `workbench.serve.server`), new requests get
503 and the ones in flight finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import shutil
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

import workbench
from workbench.core.errors import UserError
from workbench.serve.audit import AuditLog
from workbench.serve.auth import Tokens
from workbench.serve.decoding import CheckFailed, CheckPool, check_folder
from workbench.serve.limits import Limits
from workbench.serve.uploads import Refused, RequestFolder, intake_files, open_plain, safe_name

log = logging.getLogger("workbench.serve")

#: Keys of the predictor's ``describe()`` that name the model in every answer and audit line.
MODEL_KEYS = ("task", "method", "adapter_sha256", "base_model", "workbench_version")


#: The scope key set on a request whose body was cut (refused before it was all read): its response closes the
#: connection, so that the rest of the body is not read.
CUT = "workbench.body_cut"


class Gate:
    """ASGI wrapper that counts requests in flight and, once ``draining``, answers new ones 503; the response of a
    request whose body was cut (`CUT`) carries ``Connection: close``."""

    def __init__(self, app: Any):
        self.app, self.draining, self.in_flight = app, False, 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.draining:
            response = JSONResponse({"detail": "the server is shutting down; send the request again elsewhere or "
                                     "later"}, status_code=503, headers={"Connection": "close"})  # fmt: skip
            await response(scope, receive, send)
            return
        self.in_flight += 1

        async def send_closing(message: dict) -> None:
            if message["type"] == "http.response.start" and scope.get(CUT):
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, receive, send_closing)
        finally:
            self.in_flight -= 1


def create_app(predictor: Any, tokens: Tokens, audit: AuditLog, limits: Limits, intake: Path | None = None,
               workers: int = 1, spool: Path | None = None) -> Gate:  # fmt: skip
    """The app answering with ``predictor`` (``describe()``, ``answer(folder)``), wrapped in its `Gate`.

    Args:
        predictor: a loaded `workbench.clinical.predictor.ClinicalPredictor` (or anything with its two methods).
        tokens: who may call (`workbench.serve.auth.load_tokens`).
        audit: the open audit log.
        limits: request limits.
        intake: the folder JSON requests may name paths in (resolved); None refuses such requests.
        workers: threads that run ``predictor.answer``.
        spool: the folder requests' files are written into, one folder per request (None: the system's temporary
            folder; `workbench.serve.server` gives each server one of its own).
    """
    service = _Service(predictor, tokens, audit, limits, intake, workers, spool)
    app = FastAPI(title="workbench", version=workbench.__version__, docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=service.lifespan)  # fmt: skip
    app.exception_handler(Exception)(_fault)
    app.get("/health")(service.health)
    app.get("/model")(service.describe)
    app.get("/audit/head")(service.audit_head)
    app.get("/dashboard")(service.dashboard)
    app.post("/predict")(service.predict)
    return Gate(app)


def _refusal(status: int, detail: str, request_id: str | None = None, **headers: str) -> JSONResponse:
    """A one-line JSON refusal: ``{"detail"}``, with ``request_id`` when given."""
    body = {"detail": detail} if request_id is None else {"detail": detail, "request_id": request_id}
    return JSONResponse(body, status_code=status, headers=headers or None)


def _unauthorised(request: Request) -> JSONResponse:
    """401: a bearer token is asked for when none was given, and said to be unknown when one was."""
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        detail = "the bearer token given is not one of this server's (--token-file): ask its operator for yours"
    else:
        detail = "a bearer token is required: Authorization: Bearer <token>"
    return _refusal(401, detail, **{"WWW-Authenticate": "Bearer"})


async def _fault(request: Request, error: Exception) -> JSONResponse:
    """A route's bug: logged with its traceback, never a trace to clients."""
    log.exception("%s %s failed", request.method, request.url.path)
    return _refusal(500, "internal error of the server; its log has the details")


class _Service:
    """What the routes share (predictor, tokens, audit log, limits, intake folder, executor); its methods are the
    routes."""

    def __init__(self, predictor: Any, tokens: Tokens, audit: AuditLog, limits: Limits, intake: Path | None,
                 workers: int, spool: Path | None = None):  # fmt: skip
        self.predictor, self.tokens, self.audit, self.limits, self.intake = predictor, tokens, audit, limits, intake
        self.spool = spool
        self.checks = CheckPool.for_limits(limits)  # the uploads' header checks, in worker processes
        description = predictor.describe()
        self.model = {key: description.get(key) for key in MODEL_KEYS}
        self.run_seal = description.get("run_seal")  # with --trust-modified: what differed, on every audit line
        self.executor = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="workbench-predict")

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> Any:
        """The app's lifespan: at shutdown, waits for the executor."""
        yield
        self.executor.shutdown(wait=True)  # answers still running (past their timeout) finish and remove their folders
        self.checks.close()

    async def health(self) -> Any:
        """``GET /health``: ok, or 503 with the one reason no request can be answered (the audit log)."""
        if self.audit.failure:
            return JSONResponse({"status": "unhealthy", "reason": self.audit.failure}, status_code=503)
        return {"status": "ok"}

    async def audit_head(self, request: Request) -> Any:
        """``GET /audit/head``: the audit log's head, freshly signed (`workbench.serve.audit_head.sign_head`), with
        where the server keeps its signed heads."""
        if self.tokens.caller(request.headers.get("authorization")) is None:
            return _unauthorised(request)
        from workbench.serve.audit_head import sign_head

        seq, head = self.audit.head
        heads_file = str(self.audit.heads.path) if self.audit.heads is not None else None
        return await run_in_threadpool(functools.partial(sign_head, self.audit.path.name, seq, head,
                                                         heads_file=heads_file))  # fmt: skip

    async def dashboard(self, request: Request) -> Any:
        """``GET /dashboard``: the monitoring page of the audit log and the model (`workbench.serve.dashboard.page`),
        built in a worker thread; the page may load and run nothing (its ``Content-Security-Policy``)."""
        if self.tokens.caller(request.headers.get("authorization")) is None:
            return _unauthorised(request)
        from workbench.serve import dashboard

        text = await run_in_threadpool(lambda: dashboard.page(self.audit.path, self.predictor.describe()))
        return HTMLResponse(text, headers=dashboard.HEADERS)

    async def describe(self, request: Request) -> Any:
        """``GET /model``: the predictor's ``describe()``."""
        if self.tokens.caller(request.headers.get("authorization")) is None:
            return _unauthorised(request)
        return await run_in_threadpool(self.predictor.describe)

    async def predict(self, request: Request) -> JSONResponse:
        """``POST /predict``: the answer or refusal, sent only once its audit line is written."""
        caller = self.tokens.caller(request.headers.get("authorization"))
        if caller is None:
            log.warning("refused a /predict request from %s: no valid token", request.client)
            return _unauthorised(request)
        if self.audit.failure:
            return _refusal(503, f"{self.audit.failure}: no answer is given without its audit line")
        request_id, started = uuid.uuid4().hex, time.monotonic()
        folder = RequestFolder(Path(tempfile.mkdtemp(prefix="request-", dir=self.spool)), self.limits.max_request_bytes,
                               self.limits.max_files)  # fmt: skip
        answers, status, detail = await self._outcome(request, request_id, folder)
        detail = _without_folder(detail, folder.folder)
        for answer in answers or ():
            answer["status"] = _without_folder(answer.get("status"), folder.folder)
        entry = {
            "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "request_id": request_id,
            "caller": caller,
            "http_status": status,
            "input_sha256": folder.sha256 if folder.digests else None,
            "input_files": sorted(folder.digests),
            "model": self.model,
            "run_seal": self.run_seal,
            "workbench_version": workbench.__version__,
            "outputs": answers,
            "shift": next((a.get("shift") for a in answers or () if a.get("shift") is not None), None),
            "detail": detail,
            "seconds": round(time.monotonic() - started, 6),
        }
        try:
            await run_in_threadpool(self.audit.append, entry)
        except (OSError, ValueError):
            log.exception("request %s: the audit line could not be written; no answer is given", request_id)
            reason = self.audit.failure or "the audit line could not be written"
            return _refusal(503, f"{reason}: no answer is given without its audit line", request_id)
        if status != 200:
            return _refusal(status, detail, request_id)
        body = {"request_id": request_id, "input_sha256": entry["input_sha256"], "model": self.model,
                "results": answers}  # fmt: skip
        return JSONResponse(body, headers={"X-Request-ID": request_id})

    async def _outcome(self, request: Request, request_id: str, folder: RequestFolder,
                       caller: str | None = None) -> tuple[list[dict[str, Any]] | None, int, str | None]:  # fmt: skip
        """The request's answers (None when refused), HTTP status and refusal detail, within ``timeout_s``; removes
        ``folder`` unless the thread answering owns it. ``caller`` (default: the token's) owns the answers' state."""
        answers: list[dict[str, Any]] | None = None
        progress: dict[str, Any] = {"phase": "reading the request", "job": None}
        if caller is None:
            caller = self.tokens.caller(request.headers.get("authorization")) or "unknown"
        try:
            answers = await asyncio.wait_for(self._handle(request, folder, progress, caller), self.limits.timeout_s)
            status, detail = _status_of(answers)
        except asyncio.TimeoutError:
            status = 408 if progress["phase"] == "reading the request" else 504
            detail = f"no answer within {self.limits.timeout_s:g} s ({progress['phase']}; --timeout-s)"
        except (Refused, CheckFailed) as error:
            status, detail = error.status, str(error)
        except ClientDisconnect:  # no one to answer: audited, logged without a traceback
            status, detail = 499, f"the client disconnected while {progress['phase']}; nothing was answered"
            log.warning("request %s: %s", request_id, detail)
        except HTTPException as error:  # the form parser's refusals (too many files or fields, a malformed body)
            status, detail = (error.status_code if error.status_code < 500 else 400), str(error.detail)
        except UserError as error:  # the task's reader: the record's own one-line message
            status, detail = 422, str(error)
        except Exception:
            log.exception("request %s failed", request_id)
            status, detail = 500, f"internal error of the server (request {request_id}); its log has the details"
        finally:
            job = progress["job"]
            if job is None or job.cancelled():  # else the thread answering owns the folder
                shutil.rmtree(folder.folder, ignore_errors=True)
        return answers, status, detail

    async def _handle(self, request: Request, folder: RequestFolder, progress: dict[str, Any],
                      caller: str) -> list[dict[str, Any]]:  # fmt: skip
        """Receives the record, checks its files' headers in a worker process (`workbench.serve.decoding`), then
        answers it for ``caller`` on the executor; ``progress`` has the phase and the job."""
        await self._receive(request, folder)
        progress["phase"] = "checking the upload"
        problem = await run_in_threadpool(self.checks.call, check_folder, folder.folder, self.limits)
        if problem is not None:
            raise Refused(*problem)
        progress["phase"] = "answering"
        progress["job"] = self.executor.submit(_answer_then_remove, self.predictor, folder.folder, caller)
        return await asyncio.wrap_future(progress["job"])

    async def _receive(self, request: Request, folder: RequestFolder) -> None:
        """The request's record into ``folder``: checked headers first, then the multipart files or the intake
        path's files."""
        limits = self.limits
        length = request.headers.get("content-length")
        if length is None:
            raise Refused(411, "a Content-Length header is required")
        if not length.isdigit():
            raise Refused(400, f"Content-Length {length!r}: expected a number of bytes")
        if int(length) > limits.max_request_bytes:
            request.scope[CUT] = True
            raise Refused(413, f"request of {int(length) / 2**20:.1f} MiB, above this server's limit of "
                               f"{limits.max_request_bytes / 2**20:g} MiB (--max-request-mb)")  # fmt: skip
        request = Request(request.scope, _CountedBody(request, limits.max_request_bytes, int(length)))
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind == "multipart/form-data":
            async with request.form(max_files=limits.max_files, max_fields=limits.max_files) as form:
                if not any(isinstance(value, UploadFile) for _, value in form.multi_items()):
                    raise Refused(400, "multipart upload without a file: send the record's files")
                for field, value in form.multi_items():
                    if isinstance(value, UploadFile):
                        await run_in_threadpool(folder.add, safe_name(value.filename), value.file)
                    else:
                        await run_in_threadpool(folder.add_text, safe_name(f"{field}.txt"), value)
        elif kind == "application/json":
            await self._receive_json(request, folder)
        else:
            raise Refused(415, f"Content-Type {kind or '(none)'!r}: expected multipart/form-data (the record's files) "
                               "or application/json ({\"path\": ...})")  # fmt: skip

    async def _receive_json(self, request: Request, folder: RequestFolder) -> None:
        """A JSON request's record into ``folder``: the intake path's files, other fields as ``<field>.txt``."""
        try:
            body = await request.json()
        except Refused:
            raise
        except ValueError as error:
            raise Refused(400, f"JSON body: not valid JSON ({error})") from None
        except RecursionError:  # nested past Python's recursion limit
            raise Refused(400, "JSON body: nested too deeply; expected {\"path\": \"<path inside the intake "
                               "folder>\"}") from None  # fmt: skip
        if not isinstance(body, dict) or "path" not in body:
            raise Refused(400, "JSON body: expected {\"path\": \"<path inside the intake folder>\"}")
        if self.intake is None:
            raise Refused(400, "this server has no intake folder (workbench serve --intake): upload the files")
        for path in await run_in_threadpool(intake_files, self.intake, body["path"]):
            with open_plain(path) as source:
                await run_in_threadpool(folder.add, safe_name(path.name), source)
        for field, value in body.items():
            if field != "path":
                if not isinstance(value, str):
                    raise Refused(400, f"JSON body: field {field!r}: expected a string")
                await run_in_threadpool(folder.add_text, safe_name(f"{field}.txt"), value)


class _CountedBody:
    """A request's ASGI ``receive`` that counts the body bytes actually received, whatever ``Content-Length`` or
    ``Transfer-Encoding`` said: past ``max_bytes`` it refuses (413) and nothing more is read; a body that ends at
    another length than ``declared`` is refused (400)."""

    def __init__(self, request: Request, max_bytes: int, declared: int):
        self.receive, self.scope = request.receive, request.scope
        self.max_bytes, self.declared, self.received = max_bytes, declared, 0

    async def __call__(self) -> dict[str, Any]:
        message = await self.receive()
        if message["type"] != "http.request":
            return message
        self.received += len(message.get("body", b""))
        if self.received > self.max_bytes:
            self.scope[CUT] = True
            raise Refused(413, f"request above this server's limit of {self.max_bytes / 2**20:g} MiB "
                               "(--max-request-mb); the rest was not read")  # fmt: skip
        if not message.get("more_body", False) and self.received != self.declared:
            raise Refused(400, f"a body of {self.received:,} bytes where Content-Length says {self.declared:,}")
        return message


def _answer_then_remove(predictor: Any, folder: Path, caller: str) -> list[dict[str, Any]]:
    """``predictor.answer(folder, caller)``, then the request's folder is removed (also after a timeout: this
    thread owns it)."""
    try:
        return predictor.answer(folder, caller)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _without_folder(text: str | None, folder: Path) -> str | None:
    """``text`` (a reader's message) without the request's temporary folder: file names as the client sent them."""
    if text is None:
        return None
    return text.replace(f"{folder}/", "").replace(str(folder), "the upload")


def _status_of(answers: list[dict[str, Any]]) -> tuple[int, str | None]:
    """200 when at least one item was scored, else 422 with the first item's reason (400 when there was none)."""
    if any(answer.get("status") == "ok" for answer in answers):
        return 200, None
    if not answers:
        return 400, "nothing in the request could be scored"
    first = answers[0]
    return 422, f"{first.get('record')}: {first.get('status')}"
