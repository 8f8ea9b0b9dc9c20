"""Target rules (``-o targets=JSON|@FILE``): where a reference's target really is, and with
which storage options it is read.

Reference sets name their targets as their producer saw them: a POSIX path on the
producer's cluster (NCAR's GDEX publishes each set as a path, an HTTPS URL and an OSDF URL,
differing by a prefix), one host where mirrors exist, data buckets that need other
credentials or another endpoint than the rest. A rule says, for targets under a prefix,

* ``rewrite``: the text that replaces the prefix (a string), or a list of such texts, the
  mirrors, tried in order;
* ``options``: fsspec storage options for those targets, merged over ``remote_options``
  (key by key: a key of the rule replaces the same key of ``remote_options`` whole);
* ``credentials``: ``{"process": [argv...]}``, a command printing storage options that
  expire (run and refreshed by ``targets/credentials.py``; kept here as its argv).

Matching is on the target URL as the mount resolves it (a relative path joined to SOURCE's
directory, ``remote_protocol`` prefixed, ``~`` expanded: ``TargetPolicy.full_url``), for
every format alike. The **longest** matching prefix wins. A prefix matches on path-segment
boundaries: ``s3://bucket/a`` matches ``s3://bucket/a`` and ``s3://bucket/a/x`` but not
``s3://bucket/ab``; a prefix ending with ``/`` matches everything that starts with it. A local
prefix (a plain absolute path or ``file://``/``local://`` URL) matches local targets by path,
whichever of those forms a set uses. Remote prefixes and targets are compared as a client
sends them (``urls.normal_url``, for every protocol: scheme and host in lower case, default
ports dropped, escaped unreserved characters decoded, so ``%2e%2e`` is ``..``). A target whose
part after a prefix has a ``..`` segment, however escaped (``urls.climbs``: ``..%2F``, ``..\\``),
is matched by no rule: its client or server would remove the dot segments and request a path
outside the prefix, with the rule's options.
A rewrite replaces the prefix as text: a prefix and its rewrites all end with ``/`` or none
does.

Pure: no I/O, no fsspec. The policy (``targets/policy.py``) applies to the rewritten URLs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from refmount.base.errors import ConfigError
from refmount.base.redact import redact_url
from refmount.base.urls import climbs, is_local, local_path, normal_url
from refmount.config import Rules

MAX_RULES = 10_000
FIELDS = frozenset({"prefix", "rewrite", "options", "credentials"})
CREDENTIAL_KINDS = frozenset({"process"})


@dataclass(frozen=True)
class Rule:
    """One rule. ``number`` is its position in the list, from 1 (how messages name it)."""

    number: int
    prefix: str
    rewrite: tuple[str, ...] = ()  # empty: targets keep their URL (options only)
    options: Mapping[str, Any] = field(default_factory=dict)
    credentials: tuple[str, ...] | None = None  # argv of the credential process

    def describe(self) -> str:
        """How the rule is shown (xattrs, inspect, logs): number and prefix, redacted."""
        return f"{self.number} {redact_url(self.prefix)}"

    def as_json(self) -> dict[str, Any]:
        """The rule as it was written, ready for JSON (the daemon gets the rules this way)."""
        out: dict[str, Any] = {"prefix": self.prefix}
        if self.rewrite:
            out["rewrite"] = list(self.rewrite) if len(self.rewrite) > 1 else self.rewrite[0]
        if self.options:
            out["options"] = dict(self.options)
        if self.credentials is not None:
            out["credentials"] = {"process": list(self.credentials)}
        return out


@dataclass(frozen=True)
class Route:
    """Where one target is read: ``original`` (the URL as the mount resolves it), the rule
    that applied (None: none did), and ``urls``, the URL(s) to read — the mirrors in order,
    or the original alone."""

    original: str
    rule: Rule | None
    urls: tuple[str, ...]

    @property
    def rewritten(self) -> bool:
        return self.urls != (self.original,)


def _match_key(url: str) -> tuple[bool, str]:
    """(local?, the text prefixes are matched against): a local URL by its path, another as
    its client sends it (``urls.normal_url``: case of scheme and host, default port, escaped
    unreserved characters)."""
    if is_local(url):
        return True, local_path(url)
    return False, normal_url(url)


class TargetRules:
    """An ordered list of rules; ``route(url)`` applies the longest matching prefix."""

    def __init__(self, rules: Sequence[Rule] = ()) -> None:
        self.rules = tuple(rules)
        # By (local?, prefix text): a URL is matched by looking up its own prefixes that end
        # at a segment boundary, longest first — a few lookups per URL, however many rules.
        self._by_prefix = {_match_key(r.prefix): r for r in self.rules}
        # By where their options are sent: a rule's rewrites (its mirrors), or its prefix when
        # it has none; a rule whose own prefix it is wins over one that rewrites to it.
        self._by_reach = {_match_key(m): r for r in self.rules for m in r.rewrite}
        self._by_reach.update((_match_key(r.prefix), r) for r in self.rules if not r.rewrite)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def match(self, url: str) -> Rule | None:
        """The rule whose prefix is the longest that matches ``url`` (None: no rule)."""
        return _longest(self._by_prefix, url)

    def reaching(self, url: str) -> Rule | None:
        """The rule whose options may be sent to ``url`` as it is read (None: none's may): the
        one with the longest of the prefixes its targets are read under (its rewrites, or its
        prefix when it has none) that matches ``url``, on the same segment boundaries and
        refusing the same ``..`` as ``match``. A redirect's location is read with this rule's
        options, or refused (``targets/redirects.py``)."""
        return _longest(self._by_reach, url)

    @staticmethod
    def name_of(rule: Rule, url: str) -> str:
        """The target that ``rule`` reads from ``url`` (a URL it reaches): ``url`` itself for a
        rule without rewrites, else its prefix followed by what follows the rewrite ``url``
        lies under (the longest)."""
        text = _match_key(url)[1]
        for mirror in sorted(rule.rewrite, key=len, reverse=True):
            m = _match_key(mirror)[1]
            if text == m or text.startswith(m if m.endswith("/") else m + "/"):
                return rule.prefix + text[len(m):]
        return url

    def route(self, url: str) -> Route:
        """Where ``url`` (as the mount resolves it) is read: the rewrites of the rule that
        applies (each mirror's URL), or ``url`` itself."""
        rule = self.match(url)
        if rule is None or not rule.rewrite:
            return Route(url, rule, (url,))
        rest = _match_key(url)[1][len(_match_key(rule.prefix)[1]):]
        return Route(url, rule, tuple(r + rest for r in rule.rewrite))

    def as_json(self) -> list[dict[str, Any]]:
        return [r.as_json() for r in self.rules]

    @classmethod
    def from_json(cls, rules: Any) -> TargetRules:
        return cls(parse_rules(rules))


def _longest(by_prefix: Mapping[tuple[bool, str], Rule], url: str) -> Rule | None:
    """The rule of ``by_prefix`` whose prefix is the longest that matches ``url``."""
    if not by_prefix:
        return None
    local, text = _match_key(url)
    rule = by_prefix.get((local, text))
    if rule is not None:
        return rule
    # The prefixes of ``text`` a rule may have: up to a "/" (a prefix ending with "/")
    # or up to just before one (a prefix matched on the segment boundary). A rule does not
    # apply when what follows its prefix climbs out of it ("..": a client would request
    # another path than the one under the prefix, with the rule's options).
    at = len(text)
    while (at := text.rfind("/", 0, at)) >= 0:
        segment = text[at + 1 :].split("/", 1)[0]
        if segment == ".." or (not local and climbs(segment)):
            # this and every shorter prefix would be climbed out of (a remote URL's
            # segment however escaped: "%2e%2e" is decoded by normal_url, "..%2F" or
            # "..\\" by a server)
            break
        rule = by_prefix.get((local, text[: at + 1])) or by_prefix.get((local, text[:at]))
        if rule is not None:
            return rule
    return None


def options_for(rule: Rule | None, remote_options: Mapping[str, Any]) -> dict[str, Any]:
    """The storage options of targets under ``rule``: ``remote_options`` with the rule's own
    merged over them, key by key."""
    options = dict(remote_options)
    if rule is not None:
        options.update(rule.options)
    return options


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"targets: {what} must be a non-empty string")
    if any(not c.isprintable() for c in value):
        raise ConfigError(f"targets: {what} holds a control character")
    return value


def _rule(number: int, raw: Any) -> Rule:
    where = f"rule {number}"
    if not isinstance(raw, dict):
        raise ConfigError(f"targets: {where} must be a JSON object with a \"prefix\"")
    unknown = sorted(set(raw) - FIELDS)
    if unknown:
        raise ConfigError(f"targets: {where}: unknown field {unknown[0]!r} "
                          f"(fields: {', '.join(sorted(FIELDS))})")
    if "prefix" not in raw:
        raise ConfigError(f"targets: {where} has no \"prefix\"")
    prefix = _text(raw["prefix"], f"{where}: prefix")
    rewrite_raw = raw.get("rewrite")
    if rewrite_raw is None:
        rewrite: tuple[str, ...] = ()
    elif isinstance(rewrite_raw, str):
        rewrite = (_text(rewrite_raw, f"{where}: rewrite"),)
    elif isinstance(rewrite_raw, list) and rewrite_raw:
        rewrite = tuple(_text(r, f"{where}: rewrite {i + 1}") for i, r in enumerate(rewrite_raw))
    else:
        raise ConfigError(f"targets: {where}: rewrite must be a string or a non-empty list of "
                          "strings (mirrors, tried in order)")
    slash = _match_key(prefix)[1].endswith("/")
    for r in rewrite:
        if r.endswith("/") != slash:
            raise ConfigError(f"targets: {where}: the prefix and each rewrite must all end with "
                              f"'/' or none may (the prefix is replaced as text): "
                              f"{redact_url(prefix)!r} -> {redact_url(r)!r}")
    options = raw.get("options", {})
    if not isinstance(options, dict):
        raise ConfigError(f"targets: {where}: options must be a JSON object (fsspec storage "
                          "options)")
    credentials = None
    if "credentials" in raw:
        creds = raw["credentials"]
        if not isinstance(creds, dict) or set(creds) != {"process"}:
            raise ConfigError(f"targets: {where}: credentials must be {{\"process\": [COMMAND, "
                              "ARG...]}}")
        argv = creds["process"]
        if (not isinstance(argv, list) or not argv
                or not all(isinstance(a, str) and a for a in argv)):
            raise ConfigError(f"targets: {where}: credentials.process must be a non-empty list of "
                              "non-empty strings (the command and its arguments)")
        credentials = tuple(argv)
    return Rule(number, prefix, rewrite, options, credentials)


def parse_rules(raw: Any) -> list[Rule]:
    """Rules from their JSON form (a list of objects); ConfigError naming the problem."""
    if not isinstance(raw, list):
        raise ConfigError("targets must be a JSON list of rules "
                          "([{\"prefix\": ..., \"rewrite\": ..., \"options\": {...}}, ...])")
    if len(raw) > MAX_RULES:
        raise ConfigError(f"targets: more than {MAX_RULES} rules")
    rules = [_rule(i + 1, r) for i, r in enumerate(raw)]
    seen: dict[tuple[bool, str], int] = {}
    for r in rules:
        key = _match_key(r.prefix)
        if key in seen:
            raise ConfigError(f"targets: rules {seen[key]} and {r.number} have the same prefix "
                              f"{redact_url(r.prefix)!r}")
        seen[key] = r.number
    return rules


def check_rules(raw: Any, name: str = "targets") -> list[dict[str, Any]]:
    """Rules as the option table read them (JSON), checked — each rule's shape, and that its
    credential command can run; returned in JSON form (what the configuration keeps)."""
    from refmount.targets.credentialcommand import (
        command_problem,  # (it loads trio: only when rules are checked)
    )

    rules = TargetRules(parse_rules(raw)).as_json()
    for number, rule in enumerate(rules, 1):
        argv = rule.get("credentials", {}).get("process")
        if argv and (problem := command_problem(argv)) is not None:
            raise ConfigError(f"{name}: rule {number}: credentials.process: {problem}")
    return rules


def load_rules(text: str, name: str = "targets") -> list[dict[str, Any]]:
    """Rules written as ``-o targets=`` takes them (inline JSON or ``@FILE``, read now, at most
    ``MAX_RULES_FILE`` bytes), checked. Never echoes the text: rule options may hold credentials."""
    return check_rules(Rules().parse(name, text), name)


def with_own_objects(rules: TargetRules, own: tuple[str, Mapping[str, Any]] | None) -> TargetRules:
    """``rules`` and, after them, one for a set's own objects read as targets (an Icechunk
    repository's chunks: ``OpenedTree.own_objects``), with SOURCE's storage options — unless a
    rule of the user's has that very prefix."""
    if own is None:
        return rules
    prefix, options = own
    if any(_match_key(r.prefix) == _match_key(prefix) for r in rules.rules):
        return rules
    return TargetRules([*rules.rules, Rule(len(rules.rules) + 1, prefix, (), dict(options))])
