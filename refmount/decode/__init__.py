"""decode: the decoded view (``-o decode``) — each array's codec plan, chunks decoded within
bounds (in threads, or in isolated worker processes for codecs off the allow-list), and the
metadata netCDF clients need. Imports: ``base``, ``config``, ``refs``, ``cache``; never the
fetcher (the core hands it the bytes) or a front end.
"""
