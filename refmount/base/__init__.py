"""base: small helpers every layer may use, and that import nothing of refmount outside base.

refmount's exceptions by who sees them (``errors``), keeping credentials out of text
(``redact``), the bounded LRU map and single flight, trio as a guest of asyncio and calls
between the two loops (``guestloop``, ``triocall``, ``background``, ``workers``), the serving
process's settings and its helper processes (``process``, ``spawn``), an option's ``@FILE``
(``optionfile``), a mount's counters (``stats``), what a URL names (``urls``, ``urlenv``) and a
terminal's progress line. Imports: the standard library and third-party packages only.
"""
