"""The example consumer (plain confluent-kafka + the .avsc files), started after the runs, rebuilds
the effects ledger exactly as the projector left it in Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runlog.processors.audit import audit
from runlog.projections import RedisStore
from runlog.projections._state import effect_from_dict
from runlog.schemas import Codec, Effect, EffectStatus, Topics
from tests.integration.audit.conftest import AuditWorld
from tests.integration.processors.harness import start_projector, stop, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "processors" / "examples" / "effects_ledger_consumer.py"
RUNLOG = ("runlog",)  # the one import root of everything Runlog installs


def test_example_consumer_rebuilds_the_effects_ledger_of_redis(audit_world: AuditWorld,
                                                               tmp_path: Path) -> None:
    w = audit_world
    expected = audit(w.settings, progress=None)
    store = RedisStore.from_settings(w.settings)
    proj = start_projector(w.settings, f"proj-{w.settings.redis_prefix}", log=tmp_path / "projector.log")
    try:
        def projected() -> bool:
            states = store.load_states(expected.runs)
            return all(r in states and states[r].last_seq == a.state.last_seq
                       for r, a in expected.runs.items() if a.state is not None)

        assert wait_until(projected, 120), (tmp_path / "projector.log").read_text()[-3000:]
    finally:
        stop(proj)  # SIGTERM: the projector waits for its produced records before it exits
    raw = store.client.hgetall(store.effects_index_key)
    redis_ledger = {k.decode(): effect_from_dict(json.loads(v)).to_effect() for k, v in raw.items()}
    assert len(redis_ledger) >= 5  # uploads, the publish, the notifications, the open intent

    res = subprocess.run(
        [sys.executable, str(EXAMPLE),
         "--bootstrap", w.settings.kafka_bootstrap_servers, "--topic", Topics.of(w.settings).effects,
         "--exit-when-caught-up", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    ledger = json.loads(res.stdout)["effects"]
    as_dicts = {dk: {"delivery_key": e.delivery_key, "run_id": e.run_id, "target": e.target,
                     "status": e.status.value, "external_id": e.external_id, "tool": e.tool,
                     "stage": e.stage, "seq": e.seq, "updated_at": e.updated_at}
                for dk, e in redis_ledger.items()}
    assert ledger == as_dicts
    assert ledger["ab" * 32]["status"] == "INTENT"  # the still-running run's open intent


def test_example_consumer_imports_nothing_of_runlog(tmp_path: Path) -> None:
    src = EXAMPLE.read_text()
    imports = [line.split()[1] for line in src.splitlines() if line.lstrip().startswith(("import ", "from "))]
    assert [m for m in imports if m.split(".")[0] in RUNLOG] == []
    # run apart from the repository: it loads its schema by path and decodes Runlog's bytes
    eff = Effect("ab" * 32, "run-1", "cdn:images", EffectStatus.DONE, 14, 1_767_323_045_678,
                 external_id="img-1", tool="upload", stage="visual")
    probe = textwrap.dedent(f"""
        import importlib.util, json, sys
        spec = importlib.util.spec_from_file_location("example", {str(EXAMPLE)!r})
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        rec = mod.EffectsLedger().decode(bytes.fromhex(sys.argv[1]))
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {RUNLOG!r})
        print(json.dumps({{"record": rec, "runlog_modules": loaded}}))
    """)
    res = subprocess.run([sys.executable, "-c", probe, Codec().encode(eff).hex()], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=False,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["runlog_modules"] == []
    assert out["record"] == {"delivery_key": "ab" * 32, "run_id": "run-1", "target": "cdn:images",
                             "status": "DONE", "external_id": "img-1", "tool": "upload", "stage": "visual",
                             "seq": 14, "updated_at": 1_767_323_045_678}
