"""A finished run served over HTTP for clinical use (``workbench serve``), with its audit log.

`workbench.serve.server` runs it (uvicorn), `workbench.serve.app` has the routes, `workbench.serve.auth` the bearer
tokens, `workbench.serve.limits` what one request may ask for, `workbench.serve.uploads` how a request's files are
taken in and hashed, and `workbench.serve.audit` the hash-chained log and its check (``workbench audit verify``).
The modules importing FastAPI and uvicorn (``pip install -e ".[serve]"``) are imported only when serving.
"""
