"""sets: many reference sets behind one front end — catalogues (``catalog``, with ``catalogyaml``,
``stac``, ``setoptions``) and the identity of each set (``setidentity``), the sets open at once
(``opensets``, with ``setslots`` and the opener ``setopener``), reloads (``reload``), the serving
side of a catalogue or a reloading set (``setmount``), and ``refmount verify`` (``verify``).
Imports: the layers below; never a front end.
"""
