"""cache: bytes kept for reuse — the memory LRU and the persistent disk cache (``blocks``), the
child process that writes disk blocks (``writer``) and the checks of the cache directory
(``directory``). Imports: ``base``, ``config``; it knows nothing of where bytes come from.
"""
