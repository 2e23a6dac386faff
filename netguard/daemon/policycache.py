"""The daemon's cache of decoded, compiled policies, keyed by the SHA-256 of their bytes.

Decoding and compiling 10^5 names costs the daemon ~0.5 s; several sandboxes of one user bind the
same big policy, so each distinct policy is decoded and compiled once. Keyed by the hash of the
exact bytes a launcher sent (netguard.daemon.specbytes), so a hit is always the same policy. Bounded:
at most MAX_ENTRIES policies and MAX_NAMES rules in all (least recently used go first), since a
compiled rule costs a few hundred bytes. Thread-safe: binds decode off the event loop.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from netguard import rules
from netguard.daemon.specbytes import policy_from_bytes
from netguard.policy import NetworkPolicy

MAX_ENTRIES = 4
MAX_NAMES = 1_000_000  # rules over every cached policy (~500 B each): as many as one policy may hold
#: Smaller policies are not kept: decoding them costs less than a cache would save.
MIN_RULES = 1_000


class PolicyCache:
    """digest -> policy (its Ruleset memoised on it by rules.compile_policy), least recently used first."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_names: int = MAX_NAMES, min_rules: int = MIN_RULES) -> None:
        self.max_entries, self.max_names, self.min_rules = max_entries, max_names, min_rules
        self._entries: OrderedDict[bytes, NetworkPolicy] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def policy(self, data: bytes) -> NetworkPolicy:
        """The decoded and compiled policy of `data` (SpecError if it is not one); cached by content."""
        key = hashlib.sha256(data).digest()
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return found
            self.misses += 1
        policy = policy_from_bytes(data)
        rules.compile_policy(policy)  # memoised on the object: every bind that gets it reuses the index
        size = _size(policy)
        if size >= self.min_rules and size <= self.max_names:
            with self._lock:
                self._entries[key] = policy
                while len(self._entries) > self.max_entries or sum(map(_size, self._entries.values())) > self.max_names:
                    self._entries.popitem(last=False)
        return policy

    def __len__(self) -> int:
        return len(self._entries)


def _size(policy: NetworkPolicy) -> int:
    return len(policy.allow) + len(policy.deny) + len(policy.ask)


#: The daemon's one cache (a module global: control messages are expanded where no daemon object is at hand).
CACHE = PolicyCache()
