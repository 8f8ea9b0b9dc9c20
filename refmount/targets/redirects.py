"""Whether an HTTP redirect may be followed, and how: a redirect is a new target. The fetcher
(targets/fetch.py) never lets its HTTP client follow a redirect by itself; each ``3xx`` with a
``Location`` is asked about here, and its location is read only when the same checks allow it
that a target passes — then with the options of the rule that covers the location, never those
of the rule the first request was sent under:

* at most ``MAX_HOPS`` redirects per read, and none back to a URL already requested (a loop);
* an ``http://`` or ``https://`` location only (never a local file, another protocol or a
  chained URL: a server does not choose what a mount opens), that the mount's policy allows;
* a target read under a target rule (its options: headers, credentials, endpoints) is
  redirected only to a location some rule covers (``TargetRules.reaching``: the prefix its
  targets are read under), and read with that rule's options — a rule with no options for the
  destination (a signed object-store URL) is how a user allows such a redirect; a target under
  no rule may be redirected where a target under no rule could be read;
* a virtual chunk (``targets/virtualaccess.py``) is redirected only under a virtual chunk
  container the repository declares and a rule authorises (a location a rule's rewrite
  reaches counts as the target that rule would read from there).

Pure: no I/O, no fsspec. Messages name the redirect with its URLs redacted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from refmount.base.redact import redact_url
from refmount.base.urls import is_chained, normal_url
from refmount.targets.policy import TargetPolicy
from refmount.targets.rules import Rule, TargetRules
from refmount.targets.virtualaccess import VirtualAccess

MAX_HOPS = 5  # redirects followed for one read
STATUSES = frozenset({301, 302, 303, 307, 308})  # the answers that redirect a GET or HEAD
SCHEMES = frozenset({"http", "https"})


class Redirected(Exception):
    """An HTTP answer that sends the request elsewhere (``status`` in ``STATUSES``), raised
    before any of its body is read; ``location`` is its ``Location`` header (None: none)."""

    def __init__(self, status: int, location: str | None) -> None:
        super().__init__(f"HTTP {status} redirect")
        self.status = status
        self.location = location


class RedirectRefused(Exception):
    """A redirect this mount does not follow; the message names it and says why."""


@dataclass(frozen=True)
class Hop:
    """Where a followed redirect leads: the URL to request and the rule whose options it is
    requested with (None: ``remote_options`` only)."""

    url: str
    rule: Rule | None


class RedirectPolicy:
    """Which redirects a mount follows (see the module's docstring). ``virtual``: what a set's
    virtual chunks need (None: the set has none)."""

    def __init__(self, rules: TargetRules, policy: TargetPolicy, virtual: VirtualAccess | None = None,
                 max_hops: int = MAX_HOPS) -> None:
        self.rules = rules
        self.policy = policy
        self.virtual = virtual
        self.max_hops = max_hops

    def follow(self, target: str, rule: Rule | None, chain: Sequence[str], redirect: Redirected) -> Hop:
        """Where to go after ``redirect``: ``target`` is the URL the reference names, ``rule``
        the rule it was read under, ``chain`` the URLs requested so far for this read (the
        first is the one read for ``target``; the last answered ``redirect``).
        ``RedirectRefused`` naming the redirect when it may not be followed."""
        here = chain[-1]
        if redirect.location is None or not redirect.location.strip():
            raise RedirectRefused(f"HTTP {redirect.status} from {redact_url(here)} without a "
                                  "Location: nothing to follow")
        location = redirect.location.strip()

        def refuse(reason: str) -> RedirectRefused:
            return RedirectRefused(f"redirect ({redirect.status}) from {redact_url(here)} to "
                                   f"{redact_url(location)[:500]} not followed: {reason}")

        try:
            location = urljoin(here, location).partition("#")[0]
            scheme = urlsplit(location).scheme.lower() if "://" in location else ""
        except ValueError as e:  # (an unclosed "[" of an IPv6 host, ...)
            raise refuse(f"not a URL ({e})") from None
        if len(chain) > self.max_hops:
            raise refuse(f"more than {self.max_hops} redirects")
        if scheme not in SCHEMES or is_chained(location):
            raise refuse("only an http:// or https:// location is followed (a server does not "
                         "choose a local file or another protocol for this mount to read)")
        seen = {normal_url(u) for u in chain}
        if normal_url(location) in seen:
            raise refuse("a redirect loop (it leads back to a URL already requested)")
        reason = self.policy.problem(location, resolve=False)
        if reason:
            raise refuse(reason)
        reaching = self.rules.reaching(location)
        if rule is not None and reaching is None:
            raise refuse(
                f"the target is read under target rule {rule.describe()}, and no rule covers the "
                "location (a rule's options are sent only under its prefix): allow it with a "
                "rule for its prefix, e.g. -o targets='[..., {\"prefix\": \"https://HOST/\"}]' "
                "with no options for a signed object-store URL")
        if self.virtual is not None:
            # (the location as the set would name it: a rewrite's mirror read as its prefix)
            name = self.rules.name_of(reaching, location) if reaching is not None else location
            reason = self.virtual.redirect_problem(target, name)
            if reason:
                raise refuse(reason)
        return Hop(location, reaching)
