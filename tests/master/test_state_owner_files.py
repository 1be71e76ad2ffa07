"""A run's claim on its STATE_DIR (``OWNER.json``) is written owner-only through a random
temporary name: a link planted at the old fixed one (``OWNER.json.tmp``) is not followed."""

from __future__ import annotations

import stat

from weir.master.state_owner import OWNER_FILE, claim_state_dir


def test_the_claim_is_written_owner_only_never_through_a_planted_link(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    target = tmp_path / "target"
    target.write_text("untouched")
    (state / f"{OWNER_FILE}.tmp").symlink_to(target)
    claim_state_dir(str(state), "app-0001", "r1")
    assert target.read_text() == "untouched"
    assert stat.S_IMODE((state / OWNER_FILE).stat().st_mode) == 0o600
