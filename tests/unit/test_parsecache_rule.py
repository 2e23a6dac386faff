"""The policy parse cache keeps only documents that validated as policies (issue 24, item 6).

A hostile `include: /etc/shadow` is refused correctly, but YAML reads almost any text: the parsed
text used to be cached before the refusal, so a file of sandgate's held the shadow file's lines.
Every case here is judged by the bytes of every file in the cache directory, next to a valid
policy that IS cached (so the scan looks where entries land).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config import hostilefile, parsecache
from launcher.config.errors import PolicyFileError
from launcher.config.load import build_policy

SECRET = "sgshadow-7f1e0c"
SHADOW = f"root:$6${SECRET}$hash:19700:0:99999:7:::\ndaemon:*:19700:0:99999:7:::\n"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "policy-cache"
    monkeypatch.setattr(parsecache, "CACHE_DIR", d)
    return d


def _held(cache: Path) -> list[str]:
    """Every cache file that holds the secret (in any of its entries)."""
    return [p.name for p in cache.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]


def _policy(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "included",
    [
        SHADOW,  # a plain multi-line scalar: YAML reads it
        f"secret: {SECRET}\n",  # a mapping, but no policy
        f"version: 1\nnetwork:\n  allow: [{{host: a.test, bogus: {SECRET}}}]\n",  # says version 1, then fails
        f"version: 2\ndescription: {SECRET}\n",
    ],
    ids=["shadow", "mapping", "bad-network", "version-2"],
)
def test_a_refused_include_leaves_nothing_of_itself_in_the_cache(tmp_path: Path, cache: Path, included: str) -> None:
    shadow = _policy(tmp_path, "shadow", included)
    hostile = _policy(tmp_path, "hostile.yaml", f"version: 1\ninclude: [{shadow}]\n")
    with pytest.raises(PolicyFileError):
        build_policy([hostile], [], [])
    assert not _held(cache)
    control = _policy(tmp_path, "ok.yaml", f"version: 1\ndescription: {SECRET}\n")
    build_policy([control], [], [])
    assert _held(cache) == [f"{hostilefile.digest(control.read_bytes())}{parsecache.SUFFIX}"]


def test_a_refused_policy_file_itself_is_not_cached(tmp_path: Path, cache: Path) -> None:
    with pytest.raises(PolicyFileError):
        build_policy([_policy(tmp_path, "shadow", SHADOW)], [], [])
    assert not _held(cache)


def test_entries_of_an_older_sandgate_are_removed_at_the_next_store(tmp_path: Path, cache: Path) -> None:
    cache.mkdir()
    legacy = cache / f"{hostilefile.digest(SHADOW.encode())}.json"  # stored before validation, by the old rule
    legacy.write_text(f'"{SECRET}"')
    build_policy([_policy(tmp_path, "ok.yaml", "version: 1\nnetwork:\n  allow: [a.test]\n")], [], [])
    assert not legacy.exists() and not _held(cache)
    assert [p.name.endswith(parsecache.SUFFIX) for p in cache.iterdir()] == [True]
