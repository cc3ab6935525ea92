"""``runlog runs`` and ``runlog show`` with encryption on: a failed run's sealed error message is opened
with the keyring; without the keyring's key it shows ``[sealed]``, never the envelope (real broker and
Redis)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from runlog.processors.cli import main
from runlog.producers import DictInputSource, Runner
from runlog.producers.internal import run_id_for_key
from runlog.schemas import RunFailed, Settings
from tests.integration.resume._toy import failing

pytestmark = pytest.mark.integration


def test_runs_and_show_open_a_sealed_reason_with_the_keyring_and_mask_it_without(
        topics: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    sealed = topics.with_(encryption=True, keyring=str(tmp_path / "keyring"))
    secret = f"4242-{uuid.uuid4().hex[:10]}"
    wf, _ = failing(f"clisealed{uuid.uuid4().hex[:6]}")
    key = f"cli-{uuid.uuid4().hex}"
    with Runner.from_settings(sealed, source=DictInputSource({})) as runner, \
            pytest.raises((ValueError, RunFailed)):
        runner.run(wf, {"q": secret}, subject="cust-eve", idempotency_key=key)
    run_id = run_id_for_key(key)

    def said(settings: Settings, *argv: str) -> str:
        for k, v in settings.to_env().items():
            monkeypatch.setenv(k, v)
        assert main(list(argv)) == 0
        out = capsys.readouterr().out
        assert "rlenc1:" not in out
        return out

    for argv in (("runs", "--status", "FAILED"), ("show", run_id)):
        assert f"card of {secret} declined" in said(sealed, *argv), argv
        # another keyring (no key for this subject): the reason stays sealed, shown [sealed]
        masked = said(sealed.with_(keyring=str(tmp_path / "other-keyring")), *argv)
        assert secret not in masked and "[sealed]" in masked, argv
