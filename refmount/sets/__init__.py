"""sets: many reference sets behind one front end — catalogues and the identity of each set
(``catalog``), the sets open at once (``opensets``), reloads (``reload``), the serving side of a
catalogue or a reloading set (``setmount``), and ``refmount verify`` (``verify``). Imports: the
layers below; never a front end.
"""
