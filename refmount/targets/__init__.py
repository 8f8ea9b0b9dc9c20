"""targets: where a reference's bytes come from, and whether they may be read.

The fetcher (fsspec from trio, ranges, retries, mirrors, streaming), local files opened
exactly as checked (``localfile``), the confinement policy (``policy``), target rules and their
credential processes (``rules``, ``credentials``; run by ``credentialcommand``, their output
read by ``credentialoutput``), pins of each target's version (``pins``, held in a ``pintable``;
a pin file is parsed once per start and its table handed to what serves: ``pinhandover``) and
what to keep in flight to a host (``inflight``). Imports: ``base``, ``config``; never the cache,
a set or a front end.
"""
