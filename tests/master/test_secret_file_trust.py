"""Issue 29, item 10: the secret file a client finds in ``$WEIR_HOME`` is used only if it
is a private regular file of this user (the client sends the secret to the address in it
and trusts its certificate), and ``$WEIR_HOME`` is made or closed owner-only."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.users import as_other_user, other_user_available
from weir.master import auth
from weir.storage.private_files import UntrustedPath

ADDRESS = "127.0.0.1:5151"
THEIR_SECRET = "a-secret-the-other-user-chose"


def secret_file_text(secret: str) -> str:
    return json.dumps({"address": ADDRESS, "secret": secret,
                       "tls_ca_pem": "-----BEGIN CERTIFICATE-----\n"})


def assert_not_used() -> None:
    """Neither the secret nor the certificate of the file is taken, nor its address."""
    found = auth.client_credentials(ADDRESS)
    assert found.secret is None and found.tls_roots is None
    assert auth.local_master_addresses() == []


@pytest.mark.skipif(not other_user_available(), reason="needs root to act as nobody")
def test_a_secret_file_another_user_planted_is_not_used(shared_dir, monkeypatch):
    home = shared_dir / "home"
    monkeypatch.setenv(auth.HOME_ENV, str(home))

    def plant() -> None:
        home.mkdir(mode=0o777)
        home.chmod(0o777)
        path = home / "master-5151.secret"
        path.write_text(secret_file_text(THEIR_SECRET))
        path.chmod(0o600)

    as_other_user(plant)
    assert_not_used()


@pytest.mark.parametrize("how", ["link", "readable by others"])
def test_a_linked_or_open_secret_file_is_not_used(tmp_path, monkeypatch, how):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv(auth.HOME_ENV, str(home))
    path = home / "master-5151.secret"
    if how == "link":
        elsewhere = tmp_path / "elsewhere.secret"
        elsewhere.write_text(secret_file_text(THEIR_SECRET))
        elsewhere.chmod(0o600)
        path.symlink_to(elsewhere)
    else:
        path.write_text(secret_file_text(THEIR_SECRET))
        path.chmod(0o644)
    assert_not_used()


def test_a_private_secret_file_is_found(tmp_path, monkeypatch):
    monkeypatch.setenv(auth.HOME_ENV, str(tmp_path / "home"))
    auth.write_secret_file(auth.secret_path(5151), ADDRESS, "ours", b"PEM")
    found = auth.client_credentials(ADDRESS)
    assert (found.secret, found.tls_roots) == ("ours", b"PEM")
    assert auth.local_master_addresses() == [ADDRESS]


def test_weir_home_is_closed_to_owner_only_and_an_open_one_refused(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)
    monkeypatch.setenv(auth.HOME_ENV, str(home))
    auth.write_secret_file(auth.secret_path(5151), ADDRESS, "ours", b"PEM")
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE(auth.secret_path(5151).stat().st_mode) == 0o600
    home.chmod(0o777)
    with pytest.raises(UntrustedPath, match=r"WEIR_HOME.*other users may write"):
        auth.write_secret_file(auth.secret_path(5152), ADDRESS, "ours", b"PEM")


def test_writing_the_secret_file_replaces_a_planted_link(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv(auth.HOME_ENV, str(home))
    target = tmp_path / "target"
    target.write_text("untouched")
    os.symlink(target, auth.secret_path(5151))
    auth.write_secret_file(auth.secret_path(5151), ADDRESS, "ours", b"PEM")
    assert target.read_text() == "untouched"
    assert not Path(auth.secret_path(5151)).is_symlink()
