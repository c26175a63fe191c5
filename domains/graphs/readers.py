"""Readers of the graph domain-adaptation benchmarks as their authors distribute them, from a local path.

Nothing is downloaded: ``data_cards/graph-da.yaml`` says where each file comes from. A graph is named by
a path (a file, or a name inside a folder) and read by the first layout that fits:

- **Citation, ASN / ACDNE `.mat`** (``acmv9.mat``, ``citationv1.mat``, ``dblpv7.mat``; Dai et al., ACDNE,
  AAAI 2020; Zhang et al., ASN, CIKM 2021): ``attrb`` (n, d) bag-of-words (sparse or dense), ``network``
  (n, n) adjacency (sparse, possibly asymmetric), ``group`` (n, C) one-hot (or multi-hot: the first
  class is taken, and counted) or (n,) class indices.
- **Citation / Airport, UDAGCN / PyGDA text** (``<name>_edgelist.txt``, ``<name>_labels.txt`` and, for
  citation, ``<name>_docs.txt``; also under ``<name>/raw/``; Wu et al., UDAGCN, WWW 2020; PyGDA):
  one edge ``u,v`` per line (commas or spaces), one integer label per line, one comma-separated feature
  row per line. Without a docs file the node features are the one-hot degree (below).
- **Airport, struc2vec** (``<name>-airports.edgelist`` and ``labels-<name>-airports.txt`` for ``usa``,
  ``brazil``, ``europe``; Ribeiro et al., KDD 2017): ``u v`` per line with arbitrary airport ids, a
  ``node label`` header then ``id label`` rows. Features: one-hot degree capped at 7 (8 features), the
  convention of GRADE (Wu et al., AAAI 2023) that later graph-DA papers follow.
- **PyG** (``.pt`` / ``.pth``): a ``torch_geometric.data.Data`` with ``x``, ``edge_index``, ``y`` saved with
  ``torch.save`` (or a dict of those tensors), loaded with ``weights_only=True`` and exactly PyG's data
  classes allowed — never a full unpickle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from workbench.domains.graphs.graph import Graph, make_graph

from workbench.core.errors import UserError, field_error

#: One-hot degree features of graphs without node attributes: degrees 0..7, larger ones in the last bin.
AIRPORT_MAX_DEGREE = 7


@dataclass
class GraphPair:
    """A labelled source graph and a target graph in the same feature space, as read from disk."""

    source_graph: Graph
    target_graph: Graph
    description: str
    #: Where the pair came from, a path or a short name (``workbench evaluate`` names its output after it).
    source: str = ""
    notes: list[str] = field(default_factory=list)
    #: (n_T,) bool: the target nodes scored as the test split when a fold chose them (`CSBMTask.hold_out`); None:
    #: every labelled target node.
    test_nodes: torch.Tensor | None = None


def degree_one_hot(edge_index: torch.Tensor, n_nodes: int, max_degree: int = AIRPORT_MAX_DEGREE) -> np.ndarray:
    """(n_nodes, max_degree + 1) one-hot of each node's degree, degrees above ``max_degree`` in the last column."""
    degree = torch.bincount(edge_index[0], minlength=n_nodes).clamp_max(max_degree).numpy()
    features = np.zeros((n_nodes, max_degree + 1), dtype=np.float32)
    features[np.arange(n_nodes), degree] = 1.0
    return features


# -- the layouts ---------------------------------------------------------------------------------
def read_mat(path: Path) -> tuple[Graph, list[str]]:
    """An ASN/ACDNE citation graph: ``attrb``, ``network``, ``group`` in a MATLAB file."""
    import scipy.io
    import scipy.sparse

    try:
        content = scipy.io.loadmat(str(path))
    except Exception as error:  # scipy raises several kinds for a damaged or non-MATLAB file
        raise UserError(f"{path}: not a readable MATLAB .mat file ({error})") from None
    for key, what in (("attrb", "node attributes (n, d)"), ("network", "adjacency (n, n)"), ("group", "labels")):
        if key not in content:
            found = sorted(k for k in content if not k.startswith("__"))
            raise field_error(path, key, f"{what}, as the ASN/ACDNE citation files have", f"only {found}")
    for key in ("attrb", "network", "group"):  # shapes and dtypes before anything is densified
        value = content[key]
        if value.dtype.kind not in "biuf" or value.ndim != 2:
            raise field_error(path, key, "a 2-D array of real numbers (dense or sparse)",
                              f"{value.dtype} of shape {list(value.shape)}")  # fmt: skip
    n = content["attrb"].shape[0]
    if content["network"].shape != (n, n):
        raise field_error(path, "network", f"a ({n}, {n}) adjacency ({n} nodes in 'attrb')",
                          f"shape {content['network'].shape}")  # fmt: skip
    if content["group"].shape[0] != n and content["group"].shape != (1, n):
        raise field_error(path, "group", f"({n}, n_classes) one-hot labels or {n} class indices",
                          f"shape {content['group'].shape}")  # fmt: skip
    attributes, group = (_dense(content[key]) for key in ("attrb", "group"))
    network = scipy.sparse.coo_matrix(content["network"])
    notes = []
    if group.shape[0] == n and group.shape[1] > 1:
        labelled = group.sum(1) > 0
        multi = int((group.sum(1) > 1).sum())
        labels = np.where(labelled, group.argmax(1), -1)
        if multi:
            notes.append(f"{path.name}: {multi} nodes have several classes in 'group'; the first is used")
    else:
        labels = group.reshape(-1)
    edges = np.stack([network.row, network.col]).astype(np.int64)
    return make_graph(attributes.astype(np.float32), edges, labels, str(path)), notes


def _dense(value) -> np.ndarray:
    import scipy.sparse

    return value.toarray() if scipy.sparse.issparse(value) else np.asarray(value)


def _read_rows(path: Path, what: str, dtype=float) -> list[list[str]]:
    try:
        text = path.read_bytes().decode()
    except UnicodeDecodeError as error:
        raise UserError(f"{path}: not UTF-8 text ({error}); expected {what}") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if line:
            rows.append((number, re.split(r"[,\s]+", line)))
    if not rows:
        raise UserError(f"{path}: empty file; expected {what}")
    return rows


def _numbers(path: Path, rows, what: str, kind=int) -> np.ndarray:
    """``rows`` (line number, tokens) as a 2-D int64 or float64 array; a `UserError` naming the first line that holds
    something else, an integer beyond int64, or another number of values than the first line."""
    if not rows:
        raise UserError(f"{path}: no rows; expected {what} on every line")
    width, values = len(rows[0][1]), []
    for number, tokens in rows:
        try:
            row = [kind(token) for token in tokens]
        except ValueError:
            row = None
        if row is None or (kind is int and any(abs(v) >= 2**63 for v in row)):
            shown = " ".join(tokens)
            raise UserError(
                f"{path}, line {number}: expected {what}, found {shown[:80]!r}{'...' if len(shown) > 80 else ''}"
            )
        if len(row) != width:
            raise UserError(f"{path}, line {number}: {len(row)} values; expected {width} as on the first line ({what})")
        values.append(row)
    return np.array(values, dtype=np.int64 if kind is int else np.float64)


def read_text_layout(edge_file: Path) -> tuple[Graph, list[str]]:
    """The UDAGCN/PyGDA text layout, given its ``<name>_edgelist.txt``."""
    prefix = edge_file.name[: -len("_edgelist.txt")]
    labels_file = edge_file.with_name(f"{prefix}_labels.txt")
    docs_file = edge_file.with_name(f"{prefix}_docs.txt")
    if not labels_file.is_file():
        raise UserError(f"{edge_file}: its labels file {labels_file.name} is missing beside it")
    rows = _read_rows(edge_file, "one edge 'u,v' per line")
    edges = _numbers(edge_file, rows, "two integer node indices 'u,v'")
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise UserError(f"{edge_file}: expected two node indices per line, found {edges.shape[-1]}")
    labels = _numbers(labels_file, _read_rows(labels_file, "one integer label per line"), "one integer label")
    if labels.ndim != 2 or labels.shape[1] != 1:
        raise UserError(f"{labels_file}: expected one integer label per line")
    labels = labels[:, 0]
    n = len(labels)
    notes = []
    if docs_file.is_file():
        features = _numbers(docs_file, _read_rows(docs_file, "one feature row per node"), "numbers", kind=float)
        if features.shape[0] != n:
            raise UserError(f"{docs_file}: {features.shape[0]} feature rows; {labels_file.name} labels {n} nodes")
    else:
        from torch_geometric.utils import to_undirected

        if edges.min() < 0 or edges.max() >= n:
            raise UserError(f"{edge_file}: node indices {edges.min()}..{edges.max()}; expected 0..{n - 1} "
                            f"({labels_file.name} labels {n} nodes)")  # fmt: skip
        features = degree_one_hot(to_undirected(torch.as_tensor(edges.T), num_nodes=n), n)
        notes.append(f"{edge_file.name}: no {docs_file.name}; node features are the one-hot degree (0..7+)")
    return make_graph(features.astype(np.float32), edges.T, labels, str(edge_file)), notes


def read_struc2vec_airports(edge_file: Path) -> tuple[Graph, list[str]]:
    """The struc2vec airport layout, given its ``<name>-airports.edgelist``."""
    name = edge_file.name[: -len("-airports.edgelist")]
    labels_file = edge_file.with_name(f"labels-{name}-airports.txt")
    if not labels_file.is_file():
        raise UserError(f"{edge_file}: its labels file {labels_file.name} is missing beside it")
    edges = _numbers(edge_file, _read_rows(edge_file, "one edge 'u v' per line"), "two integer airport ids 'u v'")
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise UserError(f"{edge_file}: expected two airport ids per line")
    rows = _read_rows(labels_file, "a 'node label' header and 'id label' rows")
    if rows and not rows[0][1][0].lstrip("-").isdigit():
        rows = rows[1:]  # the header
    table = _numbers(labels_file, rows, "'airport_id label'")
    if table.ndim != 2 or table.shape[1] != 2:
        raise UserError(f"{labels_file}: expected two integers 'airport_id label' per line")
    ids = np.unique(np.concatenate([table[:, 0], edges.reshape(-1)]))
    index = {int(airport): i for i, airport in enumerate(ids)}
    labels = np.full(len(ids), -1, dtype=np.int64)
    labels[[index[int(a)] for a in table[:, 0]]] = table[:, 1]
    edge_index = np.vectorize(index.__getitem__)(edges).T.astype(np.int64)
    from torch_geometric.utils import to_undirected

    undirected = to_undirected(torch.as_tensor(edge_index), num_nodes=len(ids))
    notes = [f"{edge_file.name}: node features are the one-hot degree (0..{AIRPORT_MAX_DEGREE}+), as in GRADE"]
    unlabelled = int((labels < 0).sum())
    if unlabelled:
        notes.append(f"{edge_file.name}: {unlabelled} airports in edges have no label")
    features = degree_one_hot(undirected, len(ids))
    return make_graph(features, edge_index, labels, str(edge_file)), notes


def _pyg_safe_globals() -> list:
    """PyG's data classes that a saved ``Data`` pickles (and nothing else)."""
    from torch_geometric.data.data import Data, DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import EdgeStorage, GlobalStorage, NodeStorage

    return [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage, NodeStorage, EdgeStorage]


def read_pyg(path: Path) -> tuple[Graph, list[str]]:
    """A ``torch.save``'d PyG ``Data`` (or dict) with ``x``, ``edge_index``, ``y``; loaded with weights_only."""
    try:
        with torch.serialization.safe_globals(_pyg_safe_globals()):
            content = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise UserError(
            f"{path}: not loadable as a PyG Data with weights_only=True ({type(error).__name__}: "
            f"{(str(error).splitlines() or [''])[0]}); save the "
            "graph with torch.save(Data(x=..., edge_index=..., y=...)) or a dict of those tensors"
        ) from None
    if isinstance(content, tuple) and content and isinstance(content[0], dict):  # an InMemoryDataset's data.pt
        content = content[0]
    getter = content.get if isinstance(content, dict) else lambda key: getattr(content, key, None)
    for key in ("x", "edge_index", "y"):
        if getter(key) is not None and not torch.is_tensor(getter(key)):
            raise field_error(path, key, f"a tensor '{key}'", type(getter(key)).__name__)
    x, edge_index, y = getter("x"), getter("edge_index"), getter("y")
    for key, value in (("x", x), ("edge_index", edge_index)):
        if value is None:
            raise field_error(path, key, f"a tensor '{key}' in the saved Data", "none")
    if y is not None and y.ndim == 2 and y.shape[1] > 1:
        y = y.argmax(1)
    return make_graph(x, edge_index, y, str(path)), []


# -- finding a graph by path or name -------------------------------------------------------------
def _candidates(folder: Path, name: str) -> list[Path]:
    names = [
        f"{name}.mat",
        f"{name}.pt",
        f"{name}.pth",
        f"{name}_edgelist.txt",
        f"{name}/raw/{name}_edgelist.txt",
        f"{name}/{name}_edgelist.txt",
        f"{name}-airports.edgelist",
    ]
    found = []
    lowered = {p.name.lower(): p for p in folder.iterdir()} if folder.is_dir() else {}
    for candidate in names:
        path = folder / candidate
        if path.is_file():
            found.append(path)
        elif "/" not in candidate and candidate.lower() in lowered:
            found.append(lowered[candidate.lower()])
    return found


def graph_names(folder: Path) -> list[str]:
    """Names of the graphs in ``folder`` that `read_graph` can read (for messages)."""
    names = set()
    if not folder.is_dir():
        return []
    for path in folder.iterdir():
        for pattern in (r"(.+)\.(mat|pt|pth)$", r"(.+)_edgelist\.txt$", r"(.+)-airports\.edgelist$"):
            match = re.match(pattern, path.name)
            if match:
                names.add(match.group(1))
        if path.is_dir() and ((path / "raw" / f"{path.name}_edgelist.txt").is_file()):
            names.add(path.name)
    return sorted(names)


def read_graph(path: str | Path, name: str = "") -> tuple[Graph, list[str]]:
    """The graph at ``path`` (a file), or the one called ``name`` inside the folder ``path``; (graph, notes)."""
    path = Path(path).expanduser()
    if path.is_dir():
        if not name:
            raise UserError(
                f"{path}: a folder; name the source and target graphs in it with --source-graph and --target-graph "
                f"(found: {', '.join(graph_names(path)) or 'no readable graph'})"
            )
        found = _candidates(path, name)
        if not found:
            raise UserError(
                f"{path}: no graph named '{name}' (looked for {name}.mat, {name}.pt, {name}_edgelist.txt, "
                f"{name}-airports.edgelist); found: {', '.join(graph_names(path)) or 'no readable graph'}"
            )
        path = found[0]
    if not path.is_file():
        raise UserError(f"{path}: no such file or folder")
    if path.suffix == ".mat":
        return read_mat(path)
    if path.suffix in (".pt", ".pth"):
        return read_pyg(path)
    if path.name.endswith("_edgelist.txt"):
        return read_text_layout(path)
    if path.name.endswith("-airports.edgelist"):
        return read_struc2vec_airports(path)
    raise UserError(
        f"{path}: unknown graph layout; expected a .mat (ASN citation), .pt (PyG Data), <name>_edgelist.txt "
        "(UDAGCN/PyGDA) or <name>-airports.edgelist (struc2vec) — see data_cards/graph-da.yaml"
    )


def read_graph_pair(data: str | Path, source_name: str = "", target_name: str = "") -> GraphPair:
    """Source and target from ``FOLDER`` (+ names) or ``SOURCE_PATH,TARGET_PATH``; checks they fit together."""
    text = str(data)
    if "," in text and not Path(text).exists():
        parts = [part.strip() for part in text.split(",")]
        if len(parts) != 2 or not all(parts):
            raise UserError(f"--data {text!r}: expected SOURCE,TARGET (two paths) or a folder")
        (source, source_notes), (target, target_notes) = read_graph(parts[0]), read_graph(parts[1])
        description = f"{Path(parts[0]).name} → {Path(parts[1]).name}"
        where = parts[0]
    else:
        if not (source_name and target_name) and not Path(text).is_dir():
            raise UserError(
                f"--data {text}: give a folder with --source-graph and --target-graph, or SOURCE,TARGET paths"
            )
        source, source_notes = read_graph(text, source_name)
        target, target_notes = read_graph(text, target_name)
        description = f"{source_name} → {target_name} ({text})"
        where = str(Path(text) / target_name)
    if source.x.shape[1] != target.x.shape[1]:
        raise UserError(
            f"{target.name}: {target.x.shape[1]} node features, but the source {source.name} has "
            f"{source.x.shape[1]}; source and target must share one feature space (the same vocabulary or encoder)"
        )
    return GraphPair(source, target, description, where, source_notes + target_notes)
