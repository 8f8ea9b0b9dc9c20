"""http: ``refmount serve`` — HTTP requests translated into the core's calls and its errors into
statuses (``frontend``, with its plans of answers ``pathplan``; ``sets`` for several sets), ranges,
validators, listings, CORS, and the serving process (``daemon``). Imports: the layers below; never
``fuse`` (the two front ends are independent).
"""
