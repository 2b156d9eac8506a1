"""``verify`` inputs beyond a complete local folder: weights-only checkpoints (``--tokenizer``,
``--token-ids``) and Hub repo ids (downloaded into the Hugging Face cache from the real local
hub server, tests/hubserver.py).  Every model is really loaded and run with transformers."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ckpt_surgeon.cli import cli

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hubserver import HubServer  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "vocab.txt", "tokenizer.model")
Q_BIAS = "model.layers.0.self_attn.q_proj.bias"


def _run(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def _weights_only(src: Path, dst: Path, edit=None) -> Path:
    """A copy of ``src`` without any tokenizer file (a fine-tune output / surgery input built
    from a config), optionally with its safetensors rewritten by ``edit``."""
    shutil.copytree(src, dst)
    for f in TOKENIZER_FILES:
        (dst / f).unlink(missing_ok=True)
    assert not any((dst / f).exists() for f in TOKENIZER_FILES)
    if edit is not None:
        from safetensors.numpy import load_file, save_file
        save_file(edit(load_file(str(dst / "model.safetensors"))), str(dst / "model.safetensors"),
                  metadata={"format": "pt"})
    return dst


def _bump_q_bias(t):
    t[Q_BIAS] = t[Q_BIAS].copy()
    t[Q_BIAS][3] += 1.0
    return t


@pytest.fixture(scope="module")
def bare(tiny, tmp_path_factory):
    """(reference, identical candidate, corrupted candidate): the tiny qwen2 without tokenizer files."""
    root = tmp_path_factory.mktemp("bare")
    src = tiny("qwen2")
    return (_weights_only(src, root / "ref"), _weights_only(src, root / "same"),
            _weights_only(src, root / "bad", _bump_q_bias))


def test_weights_only_reference_needs_a_tokenizer_and_says_how(bare):
    ref, same, _ = bare
    res = _run("verify", ref, same, "--max-new-tokens", "0")
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr == (f"error: {ref}: has no tokenizer files; verify tokenizes the prompts with the reference's "
                          "tokenizer (pass --tokenizer PATH_OR_ID (any folder, tokenizer.json or Hub id AutoTokenizer "
                          "takes) or --token-ids FILE)\n")


def test_tokenizer_option_verifies_weights_only_checkpoints(bare, tiny):
    ref, same, bad = bare
    tok_dir = tiny("qwen2")                           # another folder that has the tokenizer files
    ok = _run("verify", ref, same, "--tokenizer", tok_dir, "--max-new-tokens", "2", "--format", "json")
    assert ok.exit_code == 0, ok.output
    d = json.loads(ok.stdout)
    assert d["passed"] is True and d["metrics"]["max_abs_diff"] == 0.0
    assert f"prompts tokenized with {tok_dir}" in d["notes"]
    assert d["prompts"][0]["prompt"] == "The attention layer projects every token into a query, a key and a value."
    assert d["prompts"][0]["reference_text"] is not None          # continuations decoded with it
    # The same tokenizer as a single tokenizer.json file.
    one = _run("verify", ref, same, "--tokenizer", tok_dir / "tokenizer.json", "--max-new-tokens", "0")
    assert one.exit_code == 0, one.output
    # A real difference is still found: exit 1.
    mism = _run("verify", ref, bad, "--tokenizer", tok_dir, "--max-new-tokens", "0")
    assert mism.exit_code == 1, mism.output
    assert mism.stderr.startswith(f"error: {bad}: mismatch: ")


def test_tokenizer_option_still_checks_a_shipped_tokenizer(bare, tiny, tmp_path):
    """A model that ships a tokenizer encoding the prompts otherwise than --tokenizer: exit 2."""
    ref, _, _ = bare
    bert_tok = tiny("bert")                            # a WordPiece tokenizer: other ids
    res = _run("verify", ref, tiny("qwen2"), "--tokenizer", bert_tok, "--max-new-tokens", "0")
    assert res.exit_code == 2, res.output
    line = res.stderr.strip()
    assert line.startswith(f"error: {tiny('qwen2')}: tokenizer encodes prompt 0 ") and "differently from the tokenizer given" in line
    assert line.endswith("(pass the tokenizer that belongs to both models with --tokenizer)")


def test_token_ids_need_no_tokenizer(bare, tmp_path):
    ref, same, bad = bare
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps([[1, 2, 3, 4, 5], [7, 7, 7], [42]]))
    ok = _run("verify", ref, same, "--token-ids", ids, "--max-new-tokens", "2", "--format", "json")
    assert ok.exit_code == 0, ok.output
    d = json.loads(ok.stdout)
    assert d["passed"] is True and [p["tokens"] for p in d["prompts"]] == [5, 3, 1]
    assert [p["prompt"] for p in d["prompts"]] == ["[1, 2, 3, 4, 5]", "[7, 7, 7]", "[42]"]
    assert all(p["reference_text"] is None and len(p["reference_continuation"]) == 2 for p in d["prompts"])
    assert "prompts given as token ids; no tokenizer was used to encode them" in d["notes"]
    # One flat list is one prompt.
    single = tmp_path / "one.json"
    single.write_text("[5, 6, 7]")
    res = _run("verify", ref, bad, "--token-ids", single, "--max-new-tokens", "0", "--format", "json")
    assert res.exit_code == 1, res.output
    assert [p["tokens"] for p in json.loads(res.stdout)["prompts"]] == [3]


@pytest.mark.parametrize("content, message", [
    ("[[1, 2], []]", "entry 1 is not a non-empty list of token ids"),
    ('[[1, "a"]]', "entry 0 holds 'a', not a token id (a non-negative integer)"),
    ("[[1, -3]]", "entry 0 holds -3, not a token id"),
    ("[1, 2", "is not valid JSON"),
    ("{}", "must hold a non-empty JSON list of token ids, or a list of such lists"),
    ("[[1, 99999]]", "token ids entry 0 holds id 99999, beyond the model's vocabulary"),
])
def test_bad_token_ids_file_is_one_line(bare, tmp_path, content, message):
    ref, same, _ = bare
    f = tmp_path / "ids.json"
    f.write_text(content)
    res = _run("verify", ref, same, "--token-ids", f, "--max-new-tokens", "0")
    assert res.exit_code == 2, res.output
    assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr, res.stderr


def test_prompts_and_token_ids_together_is_a_usage_error(bare, tmp_path):
    ref, same, _ = bare
    (tmp_path / "p.txt").write_text("hello\n")
    (tmp_path / "i.json").write_text("[1]")
    res = _run("verify", ref, same, "--prompts", tmp_path / "p.txt", "--token-ids", tmp_path / "i.json")
    assert res.exit_code == 2 and "give --prompts or --token-ids, not both" in res.stderr


# --- Hub repo ids ---------------------------------------------------------------------------------

@pytest.fixture
def hub_env(env, monkeypatch):
    """The clean Hub environment (conftest ``env``) pointed at a fresh local server."""
    # The CDN on another origin, as the Hub's is: huggingface_hub reads a file's metadata from the
    # redirect itself only when the redirect leaves the Hub's host.
    with HubServer(idle_timeout=120, cdn_host="localhost") as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        yield srv


def test_verify_accepts_hub_ids_into_the_hf_cache_then_offline(hub_env, tiny, tmp_path, monkeypatch):
    hub = hub_env
    local = tiny("qwen2_sharded")
    sha = hub.add_repo("owner/tiny", local)
    res = _run("verify", "owner/tiny", local, "--max-new-tokens", "2", "--format", "json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["passed"] is True and d["metrics"]["max_abs_diff"] == 0.0 and d["reference"] == "owner/tiny"
    # Downloaded into the normal HF cache (HF_HUB_CACHE, set by the env fixture), in huggingface_hub's layout.
    snap = tmp_path / "hf-hub-cache" / "models--owner--tiny" / "snapshots" / sha
    shards = sorted(p.name for p in local.glob("*.safetensors"))
    assert sorted(p.name for p in snap.glob("*.safetensors")) == shards
    assert (snap / "config.json").is_file() and (snap / "tokenizer.json").is_file()
    fetched = {r.path.rsplit("/", 1)[-1].split("?")[0] for r in hub.log if r.method == "GET" and r.path.startswith("/cdn/")}
    assert fetched == set(shards)                     # every weight byte came once, from the server
    # Offline: the same command runs from the cache, with no request at all.
    hub.reset_stats()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    again = _run("verify", "owner/tiny", local, "--max-new-tokens", "2", "--format", "json")
    assert again.exit_code == 0, again.output
    assert hub.repo_requests == 0
    # Offline and never downloaded: one line, exit 2.
    missing = _run("verify", "owner/other", local)
    assert missing.exit_code == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert "HF_HUB_OFFLINE=1 forbids network access" in missing.stderr and missing.stderr.startswith("error: owner/other")
    assert hub.requests == 0


def test_verify_hub_errors_are_one_line(hub_env, tiny):
    local = tiny("qwen2")
    res = _run("verify", "owner/nope", local)
    assert res.exit_code == 2
    assert res.stderr == f"error: owner/nope: repository not found on {hub_env.url} (check the name; a private " \
                         "repository also needs a token: set HF_TOKEN or run `hf auth login`)\n"
    not_a_path = _run("verify", "./missing-folder", local)
    assert not_a_path.exit_code == 2
    assert "no such file or folder (and not a Hub repo id of the form owner/name)" in not_a_path.stderr


def test_verify_compares_two_revisions_of_one_hub_repo(hub_env, tiny, tmp_path):
    """--revision / --candidate-revision: a repo whose branch `bumped` carries a changed query bias.
    The same id at two revisions must disagree; each revision against its own local copy must agree."""
    hub = hub_env
    src = tiny("qwen2")
    bumped = tmp_path / "bumped"
    shutil.copytree(src, bumped)
    from safetensors.numpy import load_file, save_file
    save_file(_bump_q_bias(load_file(str(bumped / "model.safetensors"))), str(bumped / "model.safetensors"),
              metadata={"format": "pt"})
    hub.add_repo("owner/rev", src, refs=("main",))
    hub.add_repo("owner/rev", bumped, refs=("bumped",))

    differ = _run("verify", "owner/rev", "owner/rev", "--candidate-revision", "bumped", "--max-new-tokens", "2",
                  "--format", "json")
    assert differ.exit_code == 1, differ.output
    d = json.loads(differ.stdout)
    assert d["passed"] is False and d["metrics"]["max_abs_diff"] > 0
    same = _run("verify", "owner/rev", bumped, "--revision", "bumped", "--max-new-tokens", "2", "--format", "json")
    assert same.exit_code == 0, same.output
    assert json.loads(same.stdout)["metrics"]["max_abs_diff"] == 0.0

    unknown = _run("verify", "owner/rev", src, "--revision", "nope")
    assert unknown.exit_code == 2 and len(unknown.stderr.strip().splitlines()) == 1
    assert unknown.stderr.startswith("error: owner/rev") and "nope" in unknown.stderr
    local_rev = _run("verify", src, src, "--candidate-revision", "bumped")
    assert local_rev.exit_code == 2
    assert local_rev.stderr == f"error: {src}: a revision ('bumped') applies to Hub repo ids only; this is a local path\n"


def test_a_gguf_or_weights_file_as_tokenizer_is_refused_up_front(bare, tiny, tmp_path):
    """Issue 36, item 11: `verify A B --tokenizer model.gguf` loaded both models (25 s), then said
    "internal error (Exception: stream did not contain valid UTF-8)".  Now one line before any
    model loads (the candidate here does not even exist: a run that loaded first would say so),
    naming the file and how to get a tokenizer.json out of a GGUF."""
    from gguf_util import write_gguf
    ref, _, _ = bare
    g = write_gguf(tiny("qwen2"), tmp_path / "m.gguf")
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text " * 50)
    for extra in ([], ["--corpus", corpus]):
        res = _run("verify", ref, tmp_path / "missing", "--tokenizer", g, *extra)
        assert res.exit_code == 2 and res.stdout == "", res.output
        assert res.stderr == (f"error: {g}: --tokenizer is a GGUF file, not a tokenizer (a folder, a tokenizer.json "
                              f"file or a Hub id) (its vocabulary becomes tokenizer.json with ckpt-surgeon convert {g} "
                              "-o DIR; then pass --tokenizer DIR)\n")
    res = _run("verify", ref, tmp_path / "missing", "--tokenizer", tiny("qwen2") / "model.safetensors")
    assert res.exit_code == 2 and "--tokenizer is a safetensors file, not a tokenizer" in res.stderr
    assert res.stderr.count("\n") == 1


def test_loaded_and_streamed_inputs_are_validated_alike(tiny, tmp_path):
    """Issue 35 item 4: the input checks of a loaded run (loading.prepare) and a streamed one
    (stream.open_source) are one function: the same line for a revision given with a local path,
    for a missing local path and for weights without config.json, before anything is read."""
    from ckpt_surgeon.errors import CkptError
    from ckpt_surgeon.verification.loading import prepare
    from ckpt_surgeon.verification.stream import open_source

    src = tiny("qwen2")
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(src / "model.safetensors", bare / "model.safetensors")
    cases = [(dict(source=str(src), revision="bumped"), "a revision ('bumped') applies to Hub repo ids only"),
             (dict(source=str(tmp_path / "nope"), revision=None), "no such file or folder"),
             (dict(source=str(bare), revision=None), "no config.json: ")]
    for kw, want in cases:
        lines = []
        for run in (lambda: prepare(kw["source"], tmp_path / "work", role="reference", dtype="float32",
                                    revision=kw["revision"]),
                    lambda: open_source(kw["source"], revision=kw["revision"])):
            with pytest.raises(CkptError) as e:
                run()
            lines.append(str(e.value))
        assert want in lines[0] and want in lines[1], lines
        if want != "no config.json: ":          # the two verbs are said in their own words there
            assert lines[0] == lines[1]


_BEFORE_ANY_WORK = r"""
import sys
from ckpt_surgeon import verify
from ckpt_surgeon.errors import CkptError
from ckpt_surgeon.verification.corpus import verify_corpus
ref, bad, corpus = sys.argv[1:4]
for run in (lambda: verify(ref, bad), lambda: verify_corpus(ref, bad, corpus=corpus, ctx=8)):
    try:
        run()
    except CkptError as e:
        print(e)
    else:
        raise SystemExit("not refused")
print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""


@pytest.mark.parametrize("bad", ["magic", "truncated", "no-weights"])
def test_a_bad_candidate_is_refused_before_the_reference_is_prepared(tiny, tmp_path, bad):
    """Issue 50 item 8: ``verify GOOD BAD`` converted the good reference (a 538 MB folder, 7-9 s) before refusing
    the candidate.  Both inputs' headers are checked first, in both modes: the refusal is the one line every
    command gives, and neither torch nor transformers was even imported (nothing loaded, converted or run)."""
    import subprocess
    from ckpt_surgeon.conversion import hf_to_gguf
    ref = hf_to_gguf(tiny("qwen2"), tmp_path / "ref.gguf", dtype="f32")
    cand = tmp_path / ("bad" if bad == "no-weights" else "bad.gguf")
    if bad == "magic":
        cand.write_text("hello")
    elif bad == "truncated":
        cand.write_bytes(ref.read_bytes()[:-4096])
    else:
        cand.mkdir()
        shutil.copy(tiny("qwen2") / "config.json", cand)
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text " * 50)
    r = subprocess.run([sys.executable, "-c", _BEFORE_ANY_WORK, str(ref), str(cand), str(corpus)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    first, second, loaded = r.stdout.strip().splitlines()
    assert first == second and first.startswith(f"{cand}: "), r.stdout
    assert {"magic": "not a GGUF file", "truncated": "file is truncated",
            "no-weights": "no model.safetensors"}[bad] in first
    assert loaded == "[]", r.stdout
