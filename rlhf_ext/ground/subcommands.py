"""Commands made of subcommands, one table row each: ``rlhf-ext`` and ``evalkit`` dispatch through here.

A table maps each subcommand's name to ``(module, keywords)``: the module declares the flags
(``add_arguments(parser)``) and runs the command (``run(args) -> int``); ``keywords`` are
``add_parser``'s (``help``, ``description``, ...), shown before the module is imported, plus
``defaults``: values the subcommand sets on the parsed arguments (one module serving several rows).
A module whose docstring is the description says so with ``description=None``.

Only the module of the subcommand being run is imported (:func:`add_subcommands` with
``command``), so ``--help`` and every command stay fast. The handler of a subcommand is
``args.handler`` (:data:`HANDLER`); a tool with subcommands of its own (``rlhf-ext runs show``)
sets each one's on ``args.subcommand_handler`` (:func:`set_subcommand_handler`) and runs it with
:func:`run_subcommand`: the two keys differ because argparse lets the inner parser's defaults
overwrite the outer one's. A check ``run`` makes across flags stops with the subcommand's usage
through :func:`usage_error`. A subcommand that forwards the arguments it does not know (``evalkit
sweep`` passes them to each evaluation) names the attribute that receives them with
:func:`forward_unknown_args`; any other unknown argument is an error.

Modules are found by name (:func:`importlib.import_module`): this module imports nothing of
rlhf_ext, so the commands above it may share it.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Callable, Dict, Iterable, List, Optional, Tuple

HANDLER = "handler"
SUBCOMMAND_HANDLER = "subcommand_handler"
PARSER = "subcommand_parser"

Table = Dict[str, Tuple[Optional[str], dict]]


def declare(parser: argparse.ArgumentParser, module_name: str) -> None:
    """The flags of ``module_name``'s command on ``parser``, and its ``run`` as the handler."""
    module = importlib.import_module(module_name)
    if parser.description is None:
        parser.description = module.__doc__
    module.add_arguments(parser)
    parser.set_defaults(**{HANDLER: module.run, PARSER: parser})


def add_subcommands(parser: argparse.ArgumentParser, table: Table, command: Optional[str] = None,
                    declare: Callable[[argparse.ArgumentParser, Optional[str]], None] = declare,
                    dest: str = "command") -> argparse._SubParsersAction:
    """One subparser per row of ``table``; with ``command``, only that one's flags are declared (and only
    its module imported): the others are listed by name and help. ``declare``: how a row's module
    declares its flags (default: :func:`declare`)."""
    subparsers = parser.add_subparsers(dest=dest, metavar="COMMAND")
    subparsers.required = True
    for name, (module_name, keywords) in table.items():
        keywords = dict(keywords)
        defaults = keywords.pop("defaults", None)
        sub = subparsers.add_parser(name, **keywords)
        if command is None or command == name:
            declare(sub, module_name)
            if defaults:
                sub.set_defaults(**defaults)
    return subparsers


def forward_unknown_args(parser: argparse.ArgumentParser, dest: str) -> None:
    """Arguments of this subcommand that no flag takes go to ``args.<dest>`` (a list, before what
    ``dest`` holds already) instead of failing (:func:`parse`)."""
    parser.rlhf_ext_unknown_args = dest


def parse(parser: argparse.ArgumentParser, argv: Iterable[str], dest: str = "command") -> argparse.Namespace:
    """Parse ``argv``; arguments no flag takes go where the chosen subcommand forwards them
    (:func:`forward_unknown_args`), else they are an error."""
    # parse_known_args: argparse's REMAINDER does not capture a leading option such as `smoke --help`.
    args, extra = parser.parse_known_args(list(argv))
    sub = _chosen(parser, getattr(args, dest, None))
    forward = getattr(sub, "rlhf_ext_unknown_args", None)
    if forward is not None:
        setattr(args, forward, list(extra) + list(getattr(args, forward, None) or []))
    elif extra:
        (sub or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _chosen(parser: argparse.ArgumentParser, name: Optional[str]) -> Optional[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


def run(args: argparse.Namespace) -> int:
    """Run the subcommand ``args`` were parsed for."""
    return getattr(args, HANDLER)(args)


def usage_error(args: argparse.Namespace, message: str) -> None:
    """Stop with ``message`` and the usage of the subcommand ``args`` were parsed for (exit status 2), as
    argparse does for a flag it refuses: for the checks ``run`` makes across flags."""
    getattr(args, PARSER).error(message)


def set_subcommand_handler(parser: argparse.ArgumentParser, handler: Callable[[argparse.Namespace], int]) -> None:
    """``handler`` runs ``parser``'s subcommand of a tool's own (see :func:`run_subcommand`)."""
    parser.set_defaults(**{SUBCOMMAND_HANDLER: handler})


def run_subcommand(args: argparse.Namespace) -> int:
    """Run a tool's own subcommand (``rlhf-ext runs show``): the handler its parser set."""
    return getattr(args, SUBCOMMAND_HANDLER)(args)


__all__: List[str] = ["HANDLER", "SUBCOMMAND_HANDLER", "PARSER", "Table", "declare", "add_subcommands",
                      "forward_unknown_args", "parse", "run", "usage_error", "set_subcommand_handler",
                      "run_subcommand"]
