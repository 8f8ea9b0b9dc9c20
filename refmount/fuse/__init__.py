"""fuse: the mount — FUSE requests translated into tree lookups and reader calls
(``operations``, ``catalogops`` for several sets), inode numbers, pages pushed to the kernel,
the serving process of a mount (``daemon``), and the checks of a mountpoint and why a mount
failed. Imports: the layers below; never ``http`` (the two front ends are independent).
"""
