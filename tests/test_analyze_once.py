"""``analyze`` opens its source once, for the static report and the distance profile alike
(issue 35 step 5: it used to open it a second time for the profile), and gives the same report
as the two static passes run one after the other."""
from __future__ import annotations

import json

import ckpt_surgeon.checkpoint as C
from ckpt_surgeon.analysis import redundancy as R
from ckpt_surgeon.analysis.api import analyze
from ckpt_surgeon.analysis.distance_profile import distance_profile


def test_analyze_opens_the_source_once(tiny, monkeypatch):
    src = tiny("qwen2")
    with C.open_checkpoint(src) as ck:          # the two passes, each on its own
        expect = json.dumps(R.analyze_checkpoint(ck, context=64).to_dict(), sort_keys=True)
        expect_profile = json.dumps(distance_profile(ck, context=64, deltas="log:5").to_dict(), sort_keys=True)
    opened = []
    real = C.open_checkpoint

    def counting(*args, **kwargs):              # the real opener, counted
        opened.append(args[0])
        return real(*args, **kwargs)
    monkeypatch.setattr(C, "open_checkpoint", counting)
    report = analyze(src, context=64, distance_profile=True, deltas="log:5")
    assert opened == [src]
    assert json.dumps(report.distance_profile.to_dict(), sort_keys=True) == expect_profile
    static = json.loads(json.dumps(report.to_dict(), sort_keys=True))
    static.pop("distance_profile", None)
    assert static == json.loads(expect)
    opened.clear()
    analyze(src, context=64)
    assert opened == [src]


def test_analyze_distance_profile_cli_opens_the_source_once(tiny, monkeypatch):
    """``ckpt-surgeon analyze --distance-profile``: one open for the static report and the profile
    (the CLI path: options, the library call, the renderer), and the JSON the two passes give."""
    from click.testing import CliRunner

    from ckpt_surgeon.cli import cli

    src = tiny("qwen2")
    with C.open_checkpoint(src) as ck:
        expect = R.analyze_checkpoint(ck, context=64).to_dict()
        prof = distance_profile(ck, context=64, deltas="log:5")
    expect["notes"] += [n for n in prof.notes if n not in expect["notes"]]     # as analyze attaches the profile
    expect["distance_profile"] = prof.to_dict()
    opened = []
    real = C.open_checkpoint

    def counting(*args, **kwargs):
        opened.append(args[0])
        return real(*args, **kwargs)
    monkeypatch.setattr(C, "open_checkpoint", counting)
    res = CliRunner().invoke(cli, ["analyze", str(src), "--context", "64", "--distance-profile", "--deltas", "log:5",
                                   "--format", "json"])
    assert res.exit_code == 0, res.output
    assert [str(p) for p in opened] == [str(src)]
    got = json.loads(res.output)
    assert json.dumps(got, sort_keys=True) == json.dumps(json.loads(json.dumps(expect, default=str)), sort_keys=True)
    opened.clear()
    res = CliRunner().invoke(cli, ["analyze", str(src), "--context", "64", "--distance-profile", "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert [str(p) for p in opened] == [str(src)] and res.output.startswith("profile,layer,")
