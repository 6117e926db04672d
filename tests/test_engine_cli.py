"""The kbcore command line: demo, ingest, query, delete, list, info."""

from __future__ import annotations

import json

import pytest

from kbcore.cli import _sample_files, main


def test_demo_builds_a_knowledge_base_from_the_shipped_samples(capsys):
    assert len(_sample_files()) >= 4
    assert main(["demo", "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "ingested 5 sample documents" in out
    # the key-rotation question finds the security page first
    block = out.split("? how do I rotate the API signing keys?")[1].split("?")[0]
    assert block.splitlines()[1].split()[1] == "security.md"
    assert "deploys.html" in out.split("? how do I roll back a bad deploy?")[1].splitlines()[1]


def test_ingest_query_delete_list_info(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KBCORE_HOME", str(tmp_path / "home"))
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "keys.md").write_text("# Keys\n\nRotate signing keys every ninety days.")
    (docs / "sub" / "lunch.txt").write_text("Lunch is served at noon.")
    (docs / "image.png").write_bytes(b"\x89PNG")  # unsupported: skipped when walking a directory
    assert main(["ingest", str(docs), "--kb", "team", "--metadata", '{"team": "infra"}']) == 0
    assert "ingested 2 documents" in capsys.readouterr().out
    assert main(["query", "rotate signing keys", "--kb", "team", "--top-k", "1", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert hits[0]["document_id"] == "keys.md" and hits[0]["metadata"]["team"] == "infra"
    assert main(["query", "lunch", "--kb", "team", "--filter", '{"document_id": "sub/lunch.txt"}']) == 0
    assert "sub/lunch.txt" in capsys.readouterr().out
    assert main(["list"]) == 0
    assert "team" in capsys.readouterr().out
    assert main(["info", "--kb", "team"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["documents"] == 2 and info["chunks"] == 2
    assert main(["delete", "--kb", "team", "--document", "keys.md"]) == 0
    capsys.readouterr()
    assert main(["info", "--kb", "team", "--data", str(tmp_path / "home")]) == 0
    assert json.loads(capsys.readouterr().out)["documents"] == 1


@pytest.mark.parametrize(
    "argv,match",
    [
        (["query", "x", "--kb", "missing"], "no knowledge base named 'missing'"),
        (["delete", "--kb", "kb", "--document", "nope"], "no document 'nope'"),
        (["ingest", "/definitely/not/here.txt", "--kb", "kb"], "No such file"),
    ],
)
def test_errors_exit_1_with_a_message(tmp_path, capsys, monkeypatch, argv, match):
    monkeypatch.setenv("KBCORE_HOME", str(tmp_path))
    from kbcore import Engine

    Engine(tmp_path).create_knowledge_base("kb")
    assert main(argv) == 1
    assert match in capsys.readouterr().err


def test_a_closed_stdout_pipe_ends_the_command_quietly():
    """``kbcore demo | head -1``: the reader goes away; the command stops with the SIGPIPE
    status and no traceback on stderr."""
    import os
    import subprocess
    import sys

    r, w = os.pipe()
    os.close(r)  # no reader from the start: the first write fails with EPIPE
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kbcore", "demo", "--top-k", "1"],
            stdout=w,
            stderr=subprocess.PIPE,
            timeout=120,
            check=False,
        )
    finally:
        os.close(w)
    stderr = proc.stderr.decode()
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
    assert proc.returncode == 141, (proc.returncode, stderr)


def test_parent_child_context_window_and_several_knowledge_bases(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KBCORE_HOME", str(tmp_path / "home"))
    doc = tmp_path / "guide.md"
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
    doc.write_text("\n\n".join(f"Part {w}: the {w} procedure is described here in a few words." for w in words))
    argv = ["ingest", str(doc), "--kb", "pc", "--index-type", "parent_child"]
    assert main([*argv, "--parent-chunk-size", "130", "--child-chunk-size", "40"]) == 0
    assert main(["ingest", str(doc), "--kb", "plain", "--chunk-size", "70", "--chunk-overlap", "0"]) == 0
    capsys.readouterr()
    assert main(["info", "--kb", "pc"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["index_type"], info["parent_chunk_size"], info["chunk_size"]) == ("parent_child", 130, 40)
    assert main(["query", "delta procedure", "--kb", "pc", "--top-k", "1", "--json"]) == 0
    hit = json.loads(capsys.readouterr().out)[0]
    assert "Part delta" in hit["content"] and len(hit["content"]) > 40  # the parent, not the child
    q = ["query", "delta procedure", "--kb", "plain", "--top-k", "1", "--json", "--search-type", "full_text"]
    assert main([*q, "--context-window", "1"]) == 0
    hit = json.loads(capsys.readouterr().out)[0]
    assert "charlie" in hit["content"] and "delta" in hit["content"] and "echo" in hit["content"]
    assert main(["query", "delta", "--kb", "plain", "--kb", "pc", "--top-k", "4", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert {h["metadata"]["knowledge_base"] for h in hits} == {"plain", "pc"}
