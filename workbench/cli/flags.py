"""The pieces of the ``workbench`` parser that several commands share: the run settings' flags, the plug-ins'
options (offered on the command line, then split by the plug-in that takes each), the words ``--help`` shows after
a flag, and the flags of threads, device and modified runs."""

from __future__ import annotations

import argparse
import shutil
import warnings
from typing import Any, Sequence

#: Where each kind of plug-in option is declared: (registry, class attribute, how messages name its owner).
_OPTION_KINDS = {
    "task": ("tasks", "options", "task"),
    "method": ("methods", "options", "method"),
    "generate": ("tasks", "generate_options", "the data generator of task"),
}


def _metavar(option: Any) -> str | None:
    """What ``--help`` shows after an option's flag: its choices (argparse's ``{a,b}``) or its type."""
    if option.choices is not None:
        return None
    return {int: "INT", float: "FLOAT"}.get(option.type, "TEXT")


#: Every word ``--help`` shows after a flag (`_metavar`, `workbench.core.settings.Setting.metavar`, each command's
#: own), one small vocabulary: numbers by their type, names by what they name, files by their kind
#: (``tests/test_newcomer_items.py`` holds every option of every command to it).
METAVARS = frozenset({
    "INT", "FLOAT", "TEXT", "SEED", "SEEDS", "RATES",  # numbers (SEEDS: 200,201 or 200-204), free text
    "TASK", "METHOD", "METHODS", "MODEL", "ENTRY", "METRIC", "METRICS", "STAGE", "ID", "A,B[,C]", "METHOD.OPTION=VALUE",
    "METHOD:NAME", "SHA256",  # names (SHA256: 64 hex digits)
    "PATH", "DIR", "FILE", "RUN", "LAYER", "ADDRESS",  # files and places (LAYER: a calibration layer's folder)
    "COMMAND", "ACTION",  # sub-commands
})  # fmt: skip


class _RenamedFlag(argparse.Action):
    """A renamed option's or setting's earlier flag: it sets the current one's value, with a one-line `FutureWarning`
    (`workbench.core.options.RenamedFrom`); hidden from ``--help``."""

    def __init__(self, option_strings: list[str], dest: str, notice: str, **kwargs: Any):
        self.notice = notice
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        warnings.warn(self.notice, FutureWarning, stacklevel=2)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def _add_renamed_flag(group: Any, declared: Any, dest: str, owner: str) -> bool:
    """The hidden earlier flag of ``declared`` (an option or setting with a ``renamed_from`` still accepted), writing
    into ``dest``; whether one was added."""
    earlier = declared.renamed_from
    if earlier is None or not earlier.accepted():
        return False
    flag = "--" + earlier.name.replace("_", "-")
    notice = f"{owner}{earlier.notice(flag, declared.flag)}"
    if declared.type is bool:
        group.add_argument(flag, dest=dest, action=_RenamedFlag, notice=notice, nargs=0, const=True,
                           default=argparse.SUPPRESS, help=argparse.SUPPRESS)  # fmt: skip
    else:
        group.add_argument(flag, dest=dest, action=_RenamedFlag, notice=notice, type=declared.type,
                           choices=declared.choices, metavar=None if declared.choices else _metavar(declared),
                           default=argparse.SUPPRESS, help=argparse.SUPPRESS)  # fmt: skip
    return True


def _add_settings(group: Any, command: str, shown: dict[str, Any] | None = None) -> None:
    """The flags of the run settings ``command`` takes (`workbench.core.settings.settings_for`), each with its declared
    help and default (``shown``: setting name -> the value the chosen task gives it, said instead), and the hidden
    earlier flag of a renamed one."""
    from workbench.core.settings import settings_for

    for setting in settings_for(command):
        if setting.type is bool:
            group.add_argument(setting.flag, dest=setting.name, action="store_true", help=setting.help)
            _add_renamed_flag(group, setting, setting.name, "")
            continue
        text = _domain_help() if setting.name == "domain" else setting.help
        if setting.name in (shown or {}):
            text = _with_default(_without_default(text), shown[setting.name])
        elif not setting.required:
            text = _with_default(text, "the task's" if setting.default is None else setting.default)
        metavar = None if setting.choices else setting.metavar or _metavar(setting)
        group.add_argument(setting.flag, dest=setting.name, type=setting.type, choices=setting.choices,
                           default=setting.default, required=setting.required, metavar=metavar,
                           help=text)  # fmt: skip
        _add_renamed_flag(group, setting, setting.name, "")


def _domain_help() -> str:
    """What ``--domain`` takes, its choices read from the entry points (no plug-in imported)."""
    from workbench.core.registry import tasks

    names = ", ".join(tasks.declared())
    return f"the domain to adapt to (its data set and problem): {names}; `workbench list` describes each"


def _with_default(text: str, default: Any) -> str:
    """An option's help with its default appended, unless the text already says it or there is none to say."""
    if "(default" in text or default is None or default == "" or default is False:
        return text
    return f"{text} (default: {default})"


def _without_default(text: str) -> str:
    """A run flag's help without its "(default: ...)" remark (nested brackets included), for a stated value."""
    start = text.find(" (default")
    if start < 0:
        return text
    depth, end = 0, start + 1
    for end in range(start + 1, len(text)):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        if depth == 0:
            break
    return text[:start] + text[end + 1 :]


def _add_plugin_options(
    parser: argparse.ArgumentParser,
    chosen: dict[str, list[str]] | None,
    *kinds: str,
    defaults: dict[str, dict[str, Any]] | None = None,
) -> None:
    """One group per chosen plug-in of ``kinds`` (None: every registered one), each option with the plug-in's own
    text and default (``defaults``: kind -> the values a run would take, `_adapt_defaults`). A name a second plug-in
    also declares keeps the first one's flag; which plug-in takes it is decided when parsing (`_given_options`)."""
    from workbench.core import registry
    from workbench.core.options import conditions, offered

    added: dict[str, str] = {}
    renamed: list[tuple[Any, Any, str]] = []  # (group, option, owner): earlier flags, added once every name is known
    for kind in kinds:
        plugins, attribute, label = _OPTION_KINDS[kind]
        known = getattr(registry, plugins)
        pairs = known.items() if chosen is None else [(name, known.get(name)) for name in chosen.get(kind, [])]
        for name, cls in pairs:
            declared = getattr(cls, attribute)
            if not declared:
                continue
            group = parser.add_argument_group(f"options of {label} {name}")
            values = {o.name: (defaults or {}).get(kind, {}).get(o.name, o.default) for o in declared}
            for option in declared:
                if option.name in added:
                    continue  # e.g. a task and its method declaring one name: said once, set in Python
                added[option.name] = f"{label} {name}"
                renamed.append((group, option, f"{label} {name}: "))
                text = _with_default(option.help, values[option.name])
                if conditions(declared, option, values):
                    text += f" ({'; '.join(conditions(declared, option, values))})"
                if option.type is bool:  # a switch: present means True
                    group.add_argument(option.flag, dest=f"opt_{option.name}", action="store_const", const=True,
                                       help=text)  # fmt: skip
                else:  # what holds beside the defaults is listed; the rest parses and `resolve_options` says why not
                    shown = offered(option, values)
                    choices = None if option.choices is None else [*option.choices, *option.refused]
                    metavar = "{" + ",".join(map(str, shown)) + "}" if choices and shown != choices else None
                    group.add_argument(option.flag, dest=f"opt_{option.name}", type=option.type, choices=choices,
                                       metavar=metavar or _metavar(option), help=text)  # fmt: skip
    for group, option, owner in renamed:  # an earlier name another chosen plug-in declares now stays that one's
        if option.renamed_from and option.renamed_from.name not in added:
            if _add_renamed_flag(group, option, f"opt_{option.name}", owner):
                added[option.renamed_from.name] = owner


def _given_options(args: argparse.Namespace, owners: dict[str, tuple[str, Sequence[Any]]]) -> dict[str, dict]:
    """The plug-in options given on the command line, split by kind: ``owners`` maps each kind to the chosen
    plug-in's (name, declared options). A flag no chosen plug-in declares, or two declare, is a `UserError`."""
    from workbench.core.errors import UserError

    given = {key[4:]: value for key, value in vars(args).items() if key.startswith("opt_") and value is not None}
    split: dict[str, dict] = {kind: {} for kind in owners}
    label = {kind: text for kind, (_, _, text) in _OPTION_KINDS.items()}
    for name, value in given.items():
        takers = [kind for kind, (_, declared) in owners.items() if name in {o.name for o in declared}]
        flag = "--" + name.replace("_", "-")
        if not takers:
            chosen = " or ".join(f"{label[kind]} '{owner}'" for kind, (owner, _) in owners.items())
            raise UserError(f"{flag} is not an option of {chosen}")
        if len(takers) > 1:
            both = " and ".join(f"{label[kind]} '{owners[kind][0]}'" for kind in takers)
            raise UserError(f"{flag} is an option of both {both}; set it in Python (task_options / method_options)")
        split[takers[0]][name] = value
    return split


def _width() -> int:
    """Columns to wrap help and listings to: the terminal's (80 when not a terminal), as argparse does."""
    return shutil.get_terminal_size().columns - 2


def _add_threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, metavar="INT",
                        help="CPU threads (default: chosen at start, see workbench.run.threads)")  # fmt: skip


def _add_device(parser: argparse.ArgumentParser) -> None:
    """``--device`` of the commands outside the run settings (`workbench.core.settings.SETTINGS` declares adapt's)."""
    from workbench.core.device import DEVICES

    parser.add_argument("--device", default="auto", choices=DEVICES, help="where to compute (default: auto: cuda "
                        "where torch sees a CUDA device, else cpu)")  # fmt: skip


def _add_trust_modified(parser: argparse.ArgumentParser) -> None:
    """``--trust-modified`` and ``--seal-key`` (`_add_seal_key`) of a command that reads a finished run."""
    parser.add_argument("--trust-modified", action="store_true", help="use a run that does not verify against its "
                        "seal.json (a file changed after it finished, a missing or untrusted seal); the output "
                        "records what was wrong")  # fmt: skip
    _add_seal_key(parser)


def _add_seal_key(parser: argparse.ArgumentParser) -> None:
    """``--seal-key PATH``: the ed25519 key that signs seals and whose public key verifies them
    (`workbench.core.sealkeys`); the command line sets it for the command (`workbench.cli.run`)."""
    parser.add_argument("--seal-key", metavar="PATH", help="the private key that signs and verifies seals, outside "
                        "every run folder (default: $WORKBENCH_SEAL_KEY, else "
                        "$XDG_CONFIG_HOME/workbench/seal-key.pem; made on first use)")  # fmt: skip
