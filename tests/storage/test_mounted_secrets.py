"""Keys of a Kubernetes Secret volume, laid out as the kubelet does (links to a timestamped
folder, fsGroup modes), read as root and as a non-root user in the pod's fsGroup; and
every layout that could be another user's doing refused, naming what to change."""

from __future__ import annotations

import os

import pytest

from tests.kubernetes_kubelet import write_secret_volume
from tests.users import as_other_user, other_user_available
from weir.storage.mounted_secrets import is_secret_volume_key, read_secret_volume_key
from weir.storage.private_files import UntrustedPath

FS_GROUP = 4242
needs_root = pytest.mark.skipif(not other_user_available(),
                                reason="acting as another user needs root")


def volume(tmp_path, mode: int = 0o400, fs_group: int | None = None):
    folder = tmp_path / "weir-credentials"
    write_secret_volume(folder, {"credentials.json": (b'{"secret": "s3cr3t"}', mode)}, fs_group)
    return folder, str(folder / "credentials.json")


def test_a_key_is_read_through_the_kubelets_links(tmp_path):
    folder, key = volume(tmp_path)
    assert os.path.islink(key) and os.readlink(key) == "..data/credentials.json"
    assert is_secret_volume_key(key)
    assert read_secret_volume_key(key) == b'{"secret": "s3cr3t"}'


def test_an_update_swapping_data_is_read_from_the_new_folder(tmp_path):
    folder, key = volume(tmp_path)
    write_secret_volume(folder, {"credentials.json": (b"rotated", 0o400)})
    assert read_secret_volume_key(key) == b"rotated"


def test_with_fs_group_the_group_readable_key_is_read_by_a_member_of_that_group(tmp_path):
    """As the process of a pod with fsGroup: root here is in its own group 0."""
    folder, key = volume(tmp_path, fs_group=os.getgid())
    assert oct(os.stat(key).st_mode & 0o777) == "0o440"
    assert read_secret_volume_key(key) == b'{"secret": "s3cr3t"}'


@needs_root
def test_a_non_root_user_in_the_pods_fs_group_reads_it_and_one_outside_cannot(shared_dir):
    pods = shared_dir / "pods"
    pods.mkdir(mode=0o755)  # the path to the volume, as a pod's is: root's, open to enter
    folder, key = volume(pods, fs_group=FS_GROUP)

    def read_it():
        assert read_secret_volume_key(key) == b'{"secret": "s3cr3t"}'

    as_other_user(read_it, groups=(FS_GROUP,))

    def refused():
        with pytest.raises(PermissionError):
            read_secret_volume_key(key)

    as_other_user(refused)


def test_a_world_readable_key_is_refused_naming_the_mode_to_set(tmp_path):
    _, key = volume(tmp_path, mode=0o444)
    with pytest.raises(UntrustedPath, match=r"every user may read it; mount the Secret "
                                            r"with defaultMode 0400"):
        read_secret_volume_key(key)


def test_a_group_readable_key_of_a_group_this_process_is_not_in_is_refused(tmp_path):
    folder, key = volume(tmp_path, mode=0o440)
    os.chown(os.path.realpath(key), -1, FS_GROUP) if os.getuid() == 0 else None
    if os.stat(key).st_gid in {os.getgid(), *os.getgroups()}:
        pytest.skip("needs root to give the file a group this process is not in")
    with pytest.raises(UntrustedPath, match="not in that group"):
        read_secret_volume_key(key)


def test_links_that_lead_out_of_the_volume_are_refused(tmp_path):
    folder, key = volume(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "credentials.json").write_bytes(b"planted")
    os.unlink(folder / "..data")
    os.symlink(str(elsewhere), folder / "..data")
    with pytest.raises(UntrustedPath, match="not to a timestamped folder of the volume"):
        read_secret_volume_key(key)
    plain = tmp_path / "plain.json"
    os.symlink("/etc/hostname", plain)
    assert not is_secret_volume_key(str(plain))
    with pytest.raises(UntrustedPath, match="is not a link <key> -> ..data/<key>"):
        read_secret_volume_key(str(plain))


def test_a_volume_folder_others_may_write_without_the_sticky_bit_is_refused(tmp_path):
    folder, key = volume(tmp_path)
    os.chmod(folder, 0o777)
    with pytest.raises(UntrustedPath, match="not sticky"):
        read_secret_volume_key(key)
