"""Readers of 12-lead ECG records in WFDB format (wfdb), in the layouts their publishers ship.

* PTB-XL (Wagner et al. 2020, physionet.org/content/ptb-xl/1.0.3): ``ptbxl_database.csv`` (index
  ``ecg_id``; ``scp_codes`` a dict literal {SCP code: likelihood %}; ``strat_fold`` 1–10; ``site``;
  ``filename_lr`` / ``filename_hr`` the 100 / 500 Hz records under ``records100/`` / ``records500/``) and
  ``scp_statements.csv`` (index: SCP code; ``diagnostic`` 1 for diagnostic statements; ``diagnostic_class``
  their superclass). Labels are the 5 superdiagnostic classes NORM, MI, STTC, CD, HYP: the
  ``diagnostic_class`` of every code of ``scp_codes`` whose row has ``diagnostic == 1``, as the PTB-XL
  authors' example (``example_physionet.py``) aggregates them. Recommended split: folds 1–8 train,
  9 validation, 10 test (`workbench.domains.ecg.ecg_set.PTBXL_FOLDS`).
* PhysioNet/CinC Challenge 2021 (Reyna et al. 2021): any folder tree of ``<record>.hea`` + ``<record>.mat``
  (WFDB format 16 with a 24-byte MATLAB v4 header, ``16+24``), labels in a header comment line
  ``# Dx: <SNOMED CT code>,<code>,...``, mapped to classes by a label map (`SNOMED_SUPERCLASSES` by
  default: the PTB-XL superclasses, so the two kinds of data share one label space).

Each record is read and checked by `workbench.domains.ecg.wfdb_record` and collected into an `EcgSet`
(`workbench.domains.ecg.ecg_set`); a bad record becomes a `RecordProblem` (file, what is wrong) and is skipped or
raised (``on_error``), never zero-filled.

Shapes:
    `EcgSet.signals` (n_records, 12, n_samples) float32, `EcgSet.labels` (n_records, n_classes) float32 multi-hot.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm
from workbench.domains.ecg.ecg_set import EcgSet, PreparedRecords, multi_hot, on_error_from_card
from workbench.domains.ecg.preprocess import EcgPreprocessing

from workbench.core.datacard import load_card
from workbench.core.errors import UserError, field_error
from workbench.core.paths import confined

#: PTB-XL's superdiagnostic classes, in the order of the label columns.
SUPERCLASSES: tuple[str, ...] = ("NORM", "MI", "STTC", "CD", "HYP")

#: The synthetic PTB-XL-style set shipped with the workbench (data card ``ptbxl-synthetic``).
EMBEDDED_PTBXL = Path(__file__).resolve().parent / "embedded" / "ptbxl_synthetic"

UNLABELLED = ("drop", "keep")
RESOLUTIONS = ("auto", "lr", "hr")

#: SNOMED CT codes of the CinC 2021 data (dx_mapping_scored.csv / dx_mapping_unscored.csv of
#: physionetchallenges/evaluation-2021) -> PTB-XL superclass, following PTB-XL's ``diagnostic_class`` of
#: the corresponding SCP statement. Sinus rhythm stands for NORM (see ``normal_class`` of `read_cinc2021`);
#: codes not listed (rhythms, ectopy, axis, Q-wave and voltage findings without a diagnosis) carry no class.
SNOMED_SUPERCLASSES: dict[str, str] = {
    "426783006": "NORM",  # sinus rhythm (NSR)
    "164865005": "MI",  # myocardial infarction
    "164867002": "MI",  # old myocardial infarction
    "57054005": "MI",  # acute myocardial infarction
    "54329005": "MI",  # anterior myocardial infarction
    "164861001": "STTC",  # myocardial ischemia
    "413444003": "STTC",  # acute myocardial ischemia
    "413844008": "STTC",  # chronic myocardial ischemia
    "426434006": "STTC",  # anterior ischemia
    "425419005": "STTC",  # inferior ischaemia
    "425623009": "STTC",  # lateral ischaemia
    "428750005": "STTC",  # nonspecific ST-T abnormality
    "55930002": "STTC",  # ST changes
    "429622005": "STTC",  # ST depression
    "164931005": "STTC",  # ST elevation
    "164930006": "STTC",  # ST interval abnormal
    "164934002": "STTC",  # T wave abnormal
    "59931005": "STTC",  # T wave inversion
    "111975006": "STTC",  # prolonged QT interval (PTB-XL LNGQT)
    "164909002": "CD",  # left bundle branch block
    "733534002": "CD",  # complete left bundle branch block
    "251120003": "CD",  # incomplete left bundle branch block
    "59118001": "CD",  # right bundle branch block
    "713427006": "CD",  # complete right bundle branch block
    "713426002": "CD",  # incomplete right bundle branch block
    "6374002": "CD",  # bundle branch block
    "698252002": "CD",  # nonspecific intraventricular conduction disorder
    "82226007": "CD",  # diffuse intraventricular block
    "445118002": "CD",  # left anterior fascicular block
    "445211001": "CD",  # left posterior fascicular block
    "270492004": "CD",  # 1st degree AV block
    "195042002": "CD",  # 2nd degree AV block
    "54016002": "CD",  # Mobitz type I (Wenckebach) AV block
    "426183003": "CD",  # Mobitz type II AV block
    "233917008": "CD",  # AV block
    "27885002": "CD",  # complete heart block
    "74390002": "CD",  # Wolff-Parkinson-White pattern
    "164873001": "HYP",  # left ventricular hypertrophy
    "55827005": "HYP",  # left ventricular high voltage
    "89792004": "HYP",  # right ventricular hypertrophy
    "266249003": "HYP",  # ventricular hypertrophy
    "67741000119109": "HYP",  # left atrial enlargement
    "446813000": "HYP",  # left atrial hypertrophy
    "446358003": "HYP",  # right atrial hypertrophy
    "195126007": "HYP",  # atrial hypertrophy
    "253352002": "HYP",  # left atrial abnormality
    "253339007": "HYP",  # right atrial abnormality
}


# ----------------------------------------------------------------------------------------------- PTB-XL
def ptbxl_superclasses(
    scp_codes: Sequence[Mapping[str, float]],
    statements,
    min_likelihood: float = 0.0,
    source: str | Path = "scp_statements.csv",
) -> list[list[str]]:
    """Superdiagnostic classes of each record: ``diagnostic_class`` of its diagnostic SCP codes.

    Args:
        scp_codes: per record, {SCP code: likelihood [%]} (``ptbxl_database.csv``'s column, parsed).
        statements: ``scp_statements.csv`` as a DataFrame indexed by SCP code.
        min_likelihood: ignore codes whose likelihood is below this [%]; 0 keeps every code, as the
            PTB-XL authors' example does.
        source: the statements' file, named in errors.

    Returns: one sorted list of distinct classes per record (empty when no code is diagnostic).
    """
    for column in ("diagnostic", "diagnostic_class"):
        if column not in statements.columns:
            raise UserError(f"{source}: column '{column}' missing (found {list(statements.columns)})")
    diagnostic = statements[statements["diagnostic"] == 1]
    to_class = {str(code): str(name) for code, name in diagnostic["diagnostic_class"].items() if isinstance(name, str)}
    return [
        sorted(
            {to_class[code] for code, likelihood in codes.items() if code in to_class and likelihood >= min_likelihood}
        )
        for codes in scp_codes
    ]


def _parse_scp_codes(path: Path, ecg_id, text) -> dict[str, float]:
    try:
        codes = ast.literal_eval(text) if isinstance(text, str) else None
        codes = {str(code): float(value) for code, value in codes.items()} if isinstance(codes, dict) else None
    except (ValueError, SyntaxError, TypeError, RecursionError):
        codes = None
    if codes is None:
        expected = f"a dict literal {{code: likelihood [%]}} for ecg_id {ecg_id}"
        raise field_error(path, "scp_codes", expected, repr(text)[:200])
    return codes


def read_ptbxl_tables(root: str | Path):
    """``(database, statements)``: ``ptbxl_database.csv`` (index ecg_id, ``scp_codes`` parsed to dicts) and
    ``scp_statements.csv`` (index SCP code), checked for the columns the reader needs."""
    import pandas as pd

    root = Path(root)
    tables = {}
    for name, index in (("ptbxl_database.csv", "ecg_id"), ("scp_statements.csv", 0)):
        path = root / name
        if not path.is_file():
            raise UserError(
                f"{path}: file missing; expected PTB-XL's layout (ptbxl_database.csv, scp_statements.csv, "
                "records100/, records500/) — see data card ptbxl"
            )
        try:
            tables[name] = pd.read_csv(path, index_col=index)
        except Exception as error:
            raise UserError(f"{path}: not a readable csv table ({error})") from None
    database, statements = tables["ptbxl_database.csv"], tables["scp_statements.csv"]
    path = root / "ptbxl_database.csv"
    if database.index.name != "ecg_id":
        raise field_error(path, "ecg_id", "an ecg_id column (the index)", f"columns {list(database.columns)[:6]}")
    for column in ("scp_codes", "strat_fold", "filename_lr", "filename_hr"):
        if column not in database.columns:
            raise field_error(path, column, "a column of PTB-XL's ptbxl_database.csv", "none")
    database = database.copy()
    folds = pd.to_numeric(database["strat_fold"], errors="coerce")
    bad = ~(np.isfinite(folds) & (folds == np.round(folds)))
    if bad.any():
        first = int(np.flatnonzero(bad.to_numpy())[0])
        ecg_id, found = database.index[first], repr(database["strat_fold"].iloc[first])
        raise field_error(path, "strat_fold", f"a whole fold number (1-10) for ecg_id {ecg_id}", found)
    database["strat_fold"] = folds.astype(np.int64)
    database["scp_codes"] = [_parse_scp_codes(path, i, text) for i, text in database["scp_codes"].items()]
    return database, statements


def read_ptbxl(
    root: str | Path,
    settings: EcgPreprocessing | None = None,
    *,
    resolution: str = "auto",
    classes: Sequence[str] = SUPERCLASSES,
    folds: Iterable[int] | None = None,
    on_error: str | None = None,
    unlabelled: str = "drop",
    min_likelihood: float = 0.0,
    card: str = "ptbxl",
    progress: bool = False,
    allow_outside: bool = False,
) -> EcgSet:
    """Read PTB-XL (or a set in its layout) with its superdiagnostic labels, folds and sites.

    Args:
        root: the folder holding ``ptbxl_database.csv``, ``scp_statements.csv``, ``records100/``, ``records500/``.
        settings: the preprocessing (default `EcgPreprocessing()`).
        resolution: which record of each row: ``"lr"`` (``filename_lr``, 100 Hz), ``"hr"`` (``filename_hr``,
            500 Hz), or ``"auto"``: ``hr`` when the model's rate is above 100 Hz (or unset), else ``lr``,
            and the other one for rows that have only that one.
        classes: the label columns (default NORM, MI, STTC, CD, HYP).
        folds: read only these ``strat_fold`` numbers (None: all).
        on_error: ``"skip"`` or ``"raise"`` for a bad record; None: the data card's ``on_bad_record``.
        unlabelled: ``"drop"`` records with no class among ``classes`` (PTB-XL benchmarks do) or ``"keep"``
            them as all-zero rows.
        min_likelihood: minimum likelihood [%] of an SCP code to count (0: every code, as PTB-XL's example).
        card: the data card naming the rates of the two columns and the default ``on_bad_record``.
        progress: show a progress bar.
        allow_outside: read records that ``filename_lr`` / ``filename_hr`` (or their headers) name outside ``root``
            (``--allow-paths-outside``); by default such a path stops the read (`workbench.core.paths.PathOutsideData`).
    """
    settings = settings or EcgPreprocessing()
    data_card = load_card(card)
    on_error = on_error_from_card(on_error, data_card)
    if resolution not in RESOLUTIONS:
        raise UserError(f"resolution must be one of {RESOLUTIONS}, got {resolution!r}")
    if unlabelled not in UNLABELLED:
        raise UserError(f"unlabelled must be one of {UNLABELLED}, got {unlabelled!r}")
    root = Path(root)
    database, statements = read_ptbxl_tables(root)
    if folds is not None:
        database = database[database["strat_fold"].isin(list(folds))]
    database, label_lists, dropped = _ptbxl_labels(root, database, statements, classes, min_likelihood, unlabelled)
    rates = {key: float(value) for key, value in data_card.content.get("sampling_rates_hz", {}).items()}
    collector = PreparedRecords(settings, len(database), on_error, root, allow_outside)
    order = _ptbxl_columns(resolution, settings)
    _read_ptbxl_records(collector, root, database, order, rates, progress, allow_outside)
    kept = collector.kept
    sites, patients = (_id_column(database, column, kept) for column in ("site", "patient_id"))
    return EcgSet(
        signals=collector.signals(root),
        labels=multi_hot([label_lists[i] for i in kept], classes),
        classes=tuple(classes),
        record_ids=np.array([str(i) for i in database.index.to_numpy()[kept]], dtype=str),
        sampling_rate_hz=collector.rate(root),
        lengths=np.array(collector.lengths, dtype=np.int64),
        folds=database["strat_fold"].to_numpy()[kept].astype(np.int64),
        sites=sites,
        patients=patients,
        leads=settings.leads,
        skipped=collector.skipped,
        unlabelled=dropped,
        source=str(root),
    )


def _ptbxl_labels(
    root: Path, database, statements, classes: Sequence[str], min_likelihood: float, unlabelled: str
) -> tuple[Any, list[list[str]], tuple[str, ...]]:
    """``(database, superclasses per row, dropped ecg_ids)``; rows with no class among ``classes`` are dropped
    when ``unlabelled == "drop"``."""
    label_lists = ptbxl_superclasses(
        database["scp_codes"].tolist(), statements, min_likelihood, root / "scp_statements.csv"
    )
    has_label = np.array([any(name in classes for name in names) for names in label_lists], dtype=bool)
    dropped = tuple(str(i) for i in database.index[~has_label]) if unlabelled == "drop" else ()
    if unlabelled == "drop":
        database = database[has_label]
        label_lists = [names for names, keep in zip(label_lists, has_label) if keep]
    return database, label_lists, dropped


def _ptbxl_columns(resolution: str, settings: EcgPreprocessing) -> tuple[str, ...]:
    """The record columns to try, in order, for `read_ptbxl`'s ``resolution``."""
    order = ("filename_hr", "filename_lr")
    if resolution == "lr" or (resolution == "auto" and (settings.sampling_rate_hz or 500) <= 100):
        order = ("filename_lr", "filename_hr")
    if resolution != "auto":
        order = order[:1]
    return order


def _read_ptbxl_records(
    collector: PreparedRecords,
    root: Path,
    database,
    order: tuple[str, ...],
    rates: Mapping[str, float],
    progress: bool,
    allow_outside: bool,
) -> None:
    """Add each row's record (the first non-empty column of ``order``) to ``collector``, in row order."""
    table = root / "ptbxl_database.csv"
    rows = database.itertuples()
    for position, row in enumerate(tqdm(rows, total=len(database), desc="PTB-XL records", disable=not progress)):
        column = next((name for name in order if isinstance(getattr(row, name), str) and getattr(row, name)), None)
        if column is None:
            problem = f"no record file in {' or '.join(order)}"
            collector.add(position, root / "ptbxl_database.csv", problem=problem, where=f"ecg_id {row.Index}")
            continue
        where = f"ecg_id {row.Index}, {column}"
        path = confined(getattr(row, column), root, f"{table} ({where})", allow_outside)
        collector.add(position, path, expected_rate_hz=rates.get(column), where=where)


def _id_column(database, column: str, rows: Sequence[int]) -> np.ndarray | None:
    """``column`` of the table's ``rows`` as text ids (`_id_text`); None when the table has no such column."""
    if column not in database.columns:
        return None
    return np.array([_id_text(value) for value in database[column].to_numpy()[rows]], dtype=str)


def _id_text(value) -> str:
    """An id of PTB-XL's table (``site``, ``patient_id``: float columns with gaps) as text: 2.0 -> "2", NaN -> ""."""
    if isinstance(value, (float, np.floating)):
        return "" if np.isnan(value) else (str(int(value)) if float(value).is_integer() else str(value))
    return str(value)


def read_embedded(settings: EcgPreprocessing | None = None, **options) -> EcgSet:
    """The shipped synthetic PTB-XL-style set (data card ``ptbxl-synthetic``); options as `read_ptbxl`."""
    if not (EMBEDDED_PTBXL / "ptbxl_database.csv").is_file():
        raise UserError(
            f"{EMBEDDED_PTBXL}: the embedded ECG data is missing; regenerate it with "
            "workbench.domains.ecg.generate.generate_ptbxl_synthetic"
        )
    options.setdefault("card", "ptbxl-synthetic")
    return read_ptbxl(EMBEDDED_PTBXL, settings, **options)


# ------------------------------------------------------------------------------------------ CinC 2021
def parse_dx(comments: Iterable[str]) -> list[str] | None:
    """The SNOMED CT codes of a header's ``# Dx:`` line (None when there is no such line)."""
    for comment in comments:
        key, sep, value = comment.lstrip("#").partition(":")
        if sep and key.strip().lower() == "dx":
            return [code.strip() for code in value.split(",") if code.strip()]
    return None


def load_label_map(path: str | Path) -> dict[str, str]:
    """A SNOMED CT → class map from a csv with columns ``snomed_ct`` and ``class`` (other columns ignored)."""
    import pandas as pd

    path = Path(path)
    try:
        table = pd.read_csv(path, dtype=str)
    except Exception as error:
        raise UserError(f"{path}: not a readable csv label map ({error})") from None
    for column in ("snomed_ct", "class"):
        if column not in table.columns:
            raise field_error(path, column, "columns snomed_ct and class", f"columns {list(table.columns)}")
    table = table.dropna(subset=["snomed_ct", "class"])
    return {code.strip(): name.strip() for code, name in zip(table["snomed_ct"], table["class"])}


def cinc_labels(codes: Iterable[str], label_map: Mapping[str, str], normal_class: str | None = "NORM") -> list[str]:
    """Classes of one record's SNOMED codes; ``normal_class`` is dropped when another class is present."""
    names = sorted({label_map[code] for code in codes if code in label_map})
    if normal_class is not None and normal_class in names and len(names) > 1:
        names.remove(normal_class)
    return names


def read_cinc2021(
    root: str | Path,
    settings: EcgPreprocessing | None = None,
    *,
    label_map: Mapping[str, str] | str | Path | None = None,
    classes: Sequence[str] | None = None,
    normal_class: str | None = "NORM",
    on_error: str | None = None,
    unlabelled: str = "drop",
    card: str = "cinc2021",
    progress: bool = False,
    allow_outside: bool = False,
) -> EcgSet:
    """Read PhysioNet/CinC 2021 style records (every ``*.hea`` below ``root``) with ``# Dx:`` labels.

    Args:
        root: a folder (searched recursively, records in sorted path order).
        settings: the preprocessing (default `EcgPreprocessing()`).
        label_map: SNOMED CT code → class: a dict, or a csv path (`load_label_map`); default
            `SNOMED_SUPERCLASSES` (PTB-XL's superclasses).
        classes: the label columns; default the map's classes in order of first appearance.
        normal_class: the class meaning "nothing else found" (sinus rhythm maps to NORM), dropped from a
            record that has another class; None keeps every mapped class.
        on_error: ``"skip"`` or ``"raise"`` for a bad record (a record without a ``# Dx:`` line is one);
            None: the data card's ``on_bad_record``.
        unlabelled: ``"drop"`` or ``"keep"`` records none of whose codes maps to ``classes``.
        card: the data card giving the default ``on_bad_record``.
        progress: show a progress bar.
        allow_outside: read data files that headers name outside ``root`` (``--allow-paths-outside``); by
            default such a header stops the read (`workbench.core.paths.PathOutsideData`).

    Sites are the first folder below ``root`` (``cpsc_2018``, ``georgia``, ...), or for records directly
    in ``root`` the letters their name starts with (A, E, HR, I, JS, Q, S).
    """
    settings = settings or EcgPreprocessing()
    on_error = on_error_from_card(on_error, load_card(card))
    if unlabelled not in UNLABELLED:
        raise UserError(f"unlabelled must be one of {UNLABELLED}, got {unlabelled!r}")
    label_map = _cinc_label_map(label_map)
    classes = tuple(classes) if classes is not None else tuple(dict.fromkeys(label_map.values()))
    root = Path(root)
    headers = _cinc_headers(root)
    collector = PreparedRecords(settings, len(headers), on_error, root, allow_outside)
    names, label_lists, sites, dropped = _read_cinc_records(
        collector, root, headers, label_map, classes, normal_class, unlabelled, progress
    )
    return EcgSet(
        signals=collector.signals(root),
        labels=multi_hot(label_lists, classes),
        classes=classes,
        record_ids=np.array(names, dtype=str),
        sampling_rate_hz=collector.rate(root),
        lengths=np.array(collector.lengths, dtype=np.int64),
        folds=None,
        sites=np.array(sites, dtype=str),
        leads=settings.leads,
        skipped=collector.skipped,
        unlabelled=tuple(dropped),
        source=str(root),
    )


def _cinc_label_map(label_map: Mapping[str, str] | str | Path | None) -> dict[str, str]:
    """`read_cinc2021`'s ``label_map`` as a dict of stripped SNOMED CT code → class (default `SNOMED_SUPERCLASSES`)."""
    if label_map is None:
        label_map = SNOMED_SUPERCLASSES
    elif not isinstance(label_map, Mapping):
        label_map = load_label_map(label_map)
    return {str(code).strip(): str(name) for code, name in label_map.items()}


def _cinc_headers(root: Path) -> list[Path]:
    """Every ``*.hea`` below ``root`` in sorted path order; a UserError when there is none or no ``root``."""
    if not root.is_dir():
        raise UserError(f"{root}: no such folder; expected CinC 2021 records (<name>.hea + <name>.mat)")
    headers = sorted(root.rglob("*.hea"))
    if not headers:
        raise UserError(f"{root}: no WFDB header (*.hea) found in this folder or below")
    return headers


def _read_cinc_records(
    collector: PreparedRecords,
    root: Path,
    headers: list[Path],
    label_map: Mapping[str, str],
    classes: tuple[str, ...],
    normal_class: str | None,
    unlabelled: str,
    progress: bool,
) -> tuple[list[str], list[list[str]], list[str], list[str]]:
    """Add each header's record to ``collector``; returns the kept records' names, class lists and sites, and
    the names of the unlabelled records dropped."""
    import wfdb

    label_lists: list[list[str]] = []
    names: list[str] = []
    sites: list[str] = []
    dropped: list[str] = []
    for header in tqdm(headers, desc="CinC records", disable=not progress):
        try:
            comments = wfdb.rdheader(str(header.with_suffix(""))).comments
        except Exception as error:
            collector.add(len(names), header, problem=f"unreadable WFDB header ({error})")
            continue
        codes = parse_dx(comments or ())
        if codes is None:
            collector.add(len(names), header, problem="no '# Dx:' line in the header (no labels)")
            continue
        labels = [name for name in cinc_labels(codes, label_map, normal_class) if name in classes]
        if not labels and unlabelled == "drop":
            dropped.append(header.stem)
            continue
        if collector.add(len(names), header):
            names.append(header.stem)
            label_lists.append(labels)
            sites.append(_cinc_site(root, header))
    return names, label_lists, sites, dropped


def _cinc_site(root: Path, header: Path) -> str:
    parts = header.relative_to(root).parts
    if len(parts) > 1:
        return parts[0]
    return "".join(char for char in header.stem if char.isalpha()) or header.stem
