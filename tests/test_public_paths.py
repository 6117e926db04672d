"""The public import paths survive the packages' layout (kbcore/index/, kbcore/embedders/,
kbcore/filters/, kbcore/engine/storage): what users import keeps resolving, to the same objects,
and ``import kbcore`` loads no Dify code."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("module", "names"),
    [
        ("kbcore", ["Index", "IndexSpec", "Group", "Engine", "KnowledgeBase", "Hit", "HashingEmbedder", "errors"]),
        (
            "kbcore.index",
            ["Index", "Group", "METRICS", "KINDS", "QUANTIZATIONS", "VECTORS", "RABITQ_BITS", "check_params"],
        ),
        (
            "kbcore.embedders",
            [
                "Embedder",
                "HashingEmbedder",
                "OpenAIEmbedder",
                "MiniLMEmbedder",
                "E5Embedder",
                "SentenceTransformerEmbedder",
                "CallableEmbedder",
                "as_embedder",
                "embedder_from_spec",
                "embedder_spec",
                "embedder_to_spec",
                "default_embedder",
                "describe_embedder",
                "register_embedder",
                "EMBEDDER_KINDS",
            ],
        ),
        ("kbcore.filters", ["Node", "compile_where", "native_filter", "iso8601_to_epoch", "dify_condition_to_where"]),
        ("kbcore.engine", ["Engine", "KnowledgeBase", "Index", "Hit"]),
        ("kbcore.dify", ["create_app", "serve", "parse_api_keys", "dify_condition_to_where"]),
        ("kbcore.rerankers", ["reranker_from_spec", "reranker_spec", "as_reranker"]),
    ],
)
def test_the_public_names_import_from_their_documented_paths(module, names):
    mod = __import__(module, fromlist=names)
    missing = [n for n in names if getattr(mod, n, None) is None]
    assert not missing, f"{module} lacks {missing}"


def test_the_paths_name_the_same_objects():
    import kbcore
    import kbcore.engine
    import kbcore.index
    from kbcore.dify.condition import dify_condition_to_where
    from kbcore.embedders import HashingEmbedder
    from kbcore.embedders.hashing import HashingEmbedder as Direct
    from kbcore.filters import dify_condition_to_where as via_filters

    assert kbcore.Index is kbcore.index.Index is kbcore.engine.Index
    assert kbcore.HashingEmbedder is HashingEmbedder is Direct
    assert via_filters is dify_condition_to_where


def test_importing_kbcore_and_its_filters_loads_no_dify_code():
    code = (
        "import sys, kbcore, kbcore.filters, kbcore.index, kbcore.embedders; "
        "print(sorted(m for m in sys.modules if m.startswith('kbcore.dify')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_server_shim_is_gone():
    with pytest.raises(ModuleNotFoundError):
        __import__("kbcore.server")
