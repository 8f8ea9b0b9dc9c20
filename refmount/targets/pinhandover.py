"""A pin file parsed once per start: the CLI parses ``-o pins=FILE`` (``hand_over_pins``) into
a table (targets/pintable.py) and saves it to a temporary file of its own, named in the
configuration it hands over (``cfg.pins_table``); the check of the set's targets
(``pins_for_check``, in the CLI or the indexer child of ``-f``) and the serving process
(``serving_pins``) map that file instead of parsing the pin file again. The serving process
removes it once mapped, the CLI when the start fails (``remove_pins_table``). What is served
by is then exactly what was checked, even if the pin file changes meanwhile.

A catalogue's sets, and a set indexed again by ``reload``, read the pin file themselves
(``cfg.pins_table`` is None in their configuration): a new version of the set is checked and
served by the pin file as it is then.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import TYPE_CHECKING, Any

from refmount.base.errors import ConfigError, MountError

if TYPE_CHECKING:  # numpy, which starting a mount does not load before it parses
    from refmount.targets.pintable import PinTable


def hand_over_pins(cfg: Any) -> None:
    """With ``-o pins``: parse the pin file (a MountError, one line, if it does not) and, but
    for a catalogue, save its table to a new private file (0600, created exclusively under an
    unpredictable ``refmount-pins-*.table`` name in ``$XDG_RUNTIME_DIR`` or the temporary
    directory), named by ``cfg.pins_table``."""
    if not cfg.pins:
        return
    from refmount.targets.pins import read_pins

    try:
        table = read_pins(cfg.pins)
    except ConfigError as e:
        raise MountError(str(e)) from None
    if getattr(cfg, "catalog", False):
        return  # each set reads it when it is opened
    directory = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    fd, path = tempfile.mkstemp(dir=directory, prefix="refmount-pins-", suffix=".table")
    try:
        table.save(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        os.close(fd)
    cfg.pins_table = path


def _mapped(cfg: Any) -> PinTable:
    from refmount.targets.pintable import PinTableFileError, map_table

    try:
        return map_table(cfg.pins_table)
    except (OSError, PinTableFileError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise MountError(f"pins: the table parsed from {cfg.pins} cannot be read: {why}") from None


def pins_for_check(cfg: Any) -> PinTable:
    """The pins the set's targets are checked against: the handed-over table, else the pin
    file parsed (ConfigError)."""
    if getattr(cfg, "pins_table", None):
        return _mapped(cfg)
    from refmount.targets.pins import read_pins

    return read_pins(cfg.pins)


def serving_pins(cfg: Any) -> PinTable:
    """The pins a set is served by: the handed-over table, mapped, its file removed (it is
    no one else's), else the pin file parsed (ConfigError)."""
    if getattr(cfg, "pins_table", None):
        table = _mapped(cfg)
        remove_pins_table(cfg)  # a version of the set made again reads the pin file
        return table
    from refmount.targets.pins import read_pins

    return read_pins(cfg.pins)


def remove_pins_table(cfg: Any) -> None:
    """Remove the handed-over table's file, if any (a start that failed)."""
    path = getattr(cfg, "pins_table", None)
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)
        cfg.pins_table = None
