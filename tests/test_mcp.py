"""``torchprof mcp``: the SDK's own stdio client against the server on a real 2-rank cycle (the tools
listed, diagnose and critical-path giving the CLI's documents, paths outside the roots refused, the
resources), and in-process: the roots' refusals, a document cut to the bound, the schemas."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.paths import DATA, JOBS
from helpers.processes import rank_results, run_torchrun, subprocess_env

pytest.importorskip("mcp", reason="torchprof mcp is the mcp extra: pip install 'torchprof-args[mcp]' "
                    "(make setup installs it)")

from torchprof_args.console import build_parser  # noqa: E402
from torchprof_args.mcp_server.bounded import LEAF_KEPT, bound  # noqa: E402
from torchprof_args.mcp_server.roots import RootError, Roots  # noqa: E402
from torchprof_args.mcp_server.schemas import loosened  # noqa: E402
from torchprof_args.mcp_server.server import Options, ToolRunner  # noqa: E402
from torchprof_args.mcp_server.tools import TOOLS, _digest  # noqa: E402

#: Every command the server offers as a tool.
TOOL_NAMES = ["brief", "diagnose", "critical-path", "summary", "mem", "collectives", "hang", "trend", "diff",
              "report"]
CYCLE = "iter000004-000007"
WHAT_IF = ["no data loader", "rank 1 like the median"]


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A root with one run of one real 2-rank cycle (gloo DDP traces), a run holding a link out of
    the root, a run holding a 3 MiB file; a folder outside the root; a cache folder."""
    base = tmp_path_factory.mktemp("mcp")
    root, outside, cache = base / "root", base / "outside", base / "cache"
    cycle = root / "run" / CYCLE
    cycle.mkdir(parents=True)
    for rank in (0, 1):
        shutil.copy(DATA / f"cpu_2rank_ddp_rank{rank}.json.gz",
                    cycle / f"rank{rank:05d}_vm_pid{rank + 1}.pt.trace.json.gz")
    outside.mkdir()
    (outside / "secret.json").write_text("{}")
    (root / "escape").symlink_to(outside)
    linked = root / "linked" / CYCLE
    linked.mkdir(parents=True)
    (linked / "rank00000_vm_pid1.pt.trace.json.gz").symlink_to(outside / "secret.json")
    huge = root / "huge" / CYCLE
    huge.mkdir(parents=True)
    with open(huge / "rank00000_vm_pid1.pt.trace.json.gz", "wb") as f:
        f.truncate(3 * 2**20)  # sparse: 3 MiB over a 2 MiB limit, nothing written
    return {"root": root, "outside": outside, "cache": cache, "run": root / "run", "cycle": cycle}


def cli_lines(*argv: str) -> list[Any]:
    """What ``torchprof ARGV --json`` prints, each line parsed."""
    done = subprocess.run([sys.executable, "-m", "torchprof_args", *argv, "--json", "--no-progress"],
                          capture_output=True, text=True, env=subprocess_env(), timeout=300, check=True)
    return [json.loads(line) for line in done.stdout.splitlines()]


def cli_json(*argv: str) -> Any:
    """What ``torchprof ARGV --json`` prints: one document."""
    (doc,) = cli_lines(*argv)
    return doc


# -- in process ------------------------------------------------------------------------------------


def test_roots_refuse_outside_links_out_and_huge_files(roots: dict[str, Path]) -> None:
    r = Roots.of([str(roots["root"])], 2 * 2**20)
    assert r.resolve("run") == str(roots["run"])  # relative: from the first root
    assert r.resolve(str(roots["cycle"])) == str(roots["cycle"])
    with pytest.raises(RootError, match=r"is outside the folders this server reads; give a path under"):
        r.resolve(str(roots["outside"] / "secret.json"))
    with pytest.raises(RootError, match=r"^run/../../outside is outside the folders this server reads; give"):
        r.resolve("run/../../outside")
    with pytest.raises(RootError, match=r"^escape is outside the folders this server reads \(it resolves to "
                                        r".*/outside\); give a path under"):
        r.resolve("escape")
    with pytest.raises(RootError, match=r"^linked/iter000004-000007/rank00000_vm_pid1.pt.trace.json.gz is a "
                                        r"link to .*secret.json, outside the folders this server reads"):
        r.resolve("linked")
    with pytest.raises(RootError, match=r"is 3.0 MiB, over the server's limit of 2 MiB \(--max-file-mb\)"):
        r.resolve("huge")
    with pytest.raises(RootError, match="No such file"):
        r.resolve("nothing")


def test_bound_cuts_the_longest_lists_first_and_says_so() -> None:
    doc = {"version": 1, "findings": [{"kind": f"k{i}", "text": "x" * 50} for i in range(100)],
           "notes": ["a"]}
    cut, cuts = bound(json.loads(json.dumps(doc)), 1000)
    assert len(json.dumps(cut)) <= 1000
    assert cut["findings"] == doc["findings"][:len(cut["findings"])] and cut["notes"] == ["a"]
    assert cuts == {"/findings": f"kept {len(cut['findings'])} of 100"}
    assert bound({"a": [1, 2]}, 100) == ({"a": [1, 2]}, {})
    # records keep their place: their inner lists are cut first, to LEAF_KEPT entries
    records = {"lines": [{"rank": r, "top": list(range(100))} for r in range(3)]}
    cut, cuts = bound(json.loads(json.dumps(records)), 200)
    assert [line["rank"] for line in cut["lines"]] == [0, 1, 2]
    kept = len(cut["lines"][0]["top"])
    assert LEAF_KEPT <= kept < 100 and [line["top"] for line in cut["lines"]] == [list(range(kept))] * 3
    assert cuts == {f"/lines/{r}/top": f"kept {kept} of 100" for r in range(3)}
    cut, cuts = bound(json.loads(json.dumps(records)), 60)  # then the records themselves
    assert cut == {"lines": [{"rank": 0, "top": list(range(LEAF_KEPT))}]}
    assert cuts == {"/lines": "kept 1 of 3", "/lines/0/top": f"kept {LEAF_KEPT} of 100"}


def test_schemas_allow_null_numbers_and_short_arrays() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "number"},
                                               "t": {"type": "array", "minItems": 2, "maxItems": 2}}}
    assert loosened(schema) == {"type": "object", "properties": {"x": {"type": ["number", "null"]},
                                                                 "t": {"type": "array"}}}
    assert [t.name for t in TOOLS] == TOOL_NAMES
    for tool in TOOLS:
        assert tool.output()["type"] == "object", tool.name


def test_a_call_is_its_command_line_parsed_by_torchprof() -> None:
    tools = {t.name: t for t in TOOLS}
    argv = tools["critical-path"].argv({"path": "/r", "what_if": ["--json", "no data loader"], "cycle": 4,
                                        "align_clocks": False}, "/cache")
    assert argv == ["critical-path", "/r", "--json", "--cycle=4", "--no-align-clocks", "--what-if=--json",
                    "--what-if=no data loader"]  # a value is never taken for an option
    args = build_parser().parse_args(argv)
    assert (args.what_if, args.cycle, args.align_clocks) == (["--json", "no data loader"], 4, False)
    argv = tools["trend"].argv({"runs": ["/a", "/b"], "baseline": ["/z"], "series": ["-x"]}, "/cache")
    args = build_parser().parse_args(argv)
    assert (args.inputs, args.baseline, args.series, args.json) == (["/a", "/b"], ["/z"], ["-x"], True)
    report = tools["report"].argv({"paths": ["/r"]}, "/cache")
    assert report[2:4] == ["-o", f"/cache/report-{_digest(['/r'])}.html"]


@pytest.mark.slow
def test_a_cut_document_points_at_the_whole(roots: dict[str, Path]) -> None:
    options = Options(Roots.of([str(roots["root"])], 2**30), 8 * 1024, str(roots["cache"]))
    roots["cache"].mkdir(exist_ok=True)
    runner = ToolRunner(build_parser(), options)
    doc, texts = runner.call("summary", {"paths": ["run"]})
    assert doc is not None and len(texts[0]) <= 8 * 1024
    whole = json.loads(Path(doc["cut"]["full_document"]).read_text())
    assert doc["cut"]["bytes"] == len(json.dumps(whole)) > 8 * 1024
    assert doc["cut"]["command"] == f"torchprof summary {roots['run']} --json"
    assert doc["cut"]["cuts"] and all(v.startswith("kept ") for v in doc["cut"]["cuts"].values())
    assert whole["lines"] == cli_lines("summary", str(roots["run"]))  # the CLI's --json lines, whole
    none, said = runner.call("diagnose", {"path": "run", "cycle": "4"})
    assert none is None and said == ["torchprof diagnose: cycle: '4' is not of type 'integer'"]
    none, said = runner.call("diagnose", {"path": "run", "bogus": 1})
    assert none is None and "Additional properties are not allowed ('bogus' was unexpected)" in said[0]


# -- the SDK's stdio client against the server -----------------------------------------------------


@pytest.mark.slow
def test_the_sdk_client_gets_the_cli_documents_and_paths_outside_are_refused(roots: dict[str, Path]) -> None:
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    run = str(roots["run"])
    expected_diagnose = cli_json("diagnose", run)
    expected_path = cli_json("critical-path", run, *[x for q in WHAT_IF for x in ("--what-if", q)])
    params = StdioServerParameters(
        command=sys.executable, env=subprocess_env(),
        args=["-m", "torchprof_args", "mcp", "--root", str(roots["root"]), "--cache-dir", str(roots["cache"]),
              "--max-file-mb", "2"])

    async def session() -> dict[str, Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            tools = (await client.list_tools()).tools
            got: dict[str, Any] = {"tools": tools}
            # the client checks each result against the tool's output schema
            got["diagnose"] = await client.call_tool("diagnose", {"path": run})
            got["critical-path"] = await client.call_tool("critical-path",
                                                          {"path": "run", "what_if": WHAT_IF})
            secret = str(roots["outside"] / "secret.json")
            got["outside"] = await client.call_tool("diagnose", {"path": secret})
            got["link"] = await client.call_tool("collectives", {"paths": ["linked"]})
            got["huge"] = await client.call_tool("mem", {"paths": ["huge"]})
            for name, arguments in (("summary", {"paths": ["run"]}), ("mem", {"paths": ["run"]}),
                                    ("collectives", {"paths": ["run"]}), ("report", {"paths": ["run"]})):
                got[name] = await client.call_tool(name, arguments)  # checked against their schemas
            got["resources"] = (await client.list_resources()).resources
            cycle_uri = roots["cycle"].as_uri()
            got["cycle"] = await client.read_resource(cycle_uri)
            return got

    def tree() -> list[tuple[str, int]]:
        return sorted((str(f), f.lstat().st_mtime_ns) for f in roots["root"].rglob("*"))

    before = tree()
    got = anyio.run(session)
    assert tree() == before  # read-only: nothing written under the root (no sidecar, the report elsewhere)
    assert [t.name for t in got["tools"]] == TOOL_NAMES
    assert all(t.output_schema and t.input_schema["additionalProperties"] is False for t in got["tools"])
    for name, expected in (("diagnose", expected_diagnose), ("critical-path", expected_path)):
        result = got[name]
        assert not result.is_error, result.content
        assert result.structured_content == expected  # the CLI's --json, the same document
        assert json.loads(result.content[0].text) == expected
    assert expected_diagnose["ranks"] == 2 and len(expected_path["what_if"]) == 2
    for key, sentence in (("outside", "is outside the folders this server reads"),
                          ("link", "is a link to "), ("huge", "over the server's limit of 2 MiB")):
        result = got[key]
        assert result.is_error and result.structured_content is None, key
        assert len(result.content) == 1 and sentence in result.content[0].text, result.content[0].text
        assert "Traceback" not in result.content[0].text
    for name in ("summary", "mem", "collectives", "report"):
        assert not got[name].is_error and got[name].structured_content, got[name].content
    assert [line["rank"] for line in got["summary"].structured_content["lines"][:2]] == [0, 1]
    report = Path(got["report"].structured_content["output"])
    assert report.parent == roots["cache"] and report.read_text().startswith("<!DOCTYPE html>")
    uris = {r.uri for r in got["resources"]}
    assert {roots["run"].as_uri(), roots["cycle"].as_uri()} <= uris
    listing = json.loads(got["cycle"].contents[0].text)
    assert listing["kind"] == "cycle" and [t["rank"] for t in listing["traces"]] == [0, 1]


@pytest.mark.slow
def test_a_cycle_a_real_job_published_is_read_from_its_sidecars_as_by_the_cli(tmp_path: Path) -> None:
    """tests/jobs/diagnose_job.py on 2 gloo ranks, rank 1 slower by 20 ms a step: the published cycle
    (traces and sidecars) through the SDK's client, against the CLI."""
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    job = tmp_path / "job"
    job.mkdir()
    proc = run_torchrun(JOBS / "diagnose_job.py", "--result-dir", str(job), "--slow-rank", "1",
                        "--slow-ms", "20", "--torch-profile", "--torch-profile-dir", "prof",
                        "--torch-profile-ranks", "all", "--torch-profile-skip-first", "1",
                        "--torch-profile-warmup", "1", "--torch-profile-active", "3", cwd=job)
    assert proc.returncode == 0 and {r["ended"] for r in rank_results(job).values()} == {"done"}, proc.stderr
    prof = job / "prof"
    assert len(list(prof.glob("*/summaries/*.summary.json"))) == 2  # published with their sidecars
    expected = cli_json("diagnose", str(prof)), cli_json("critical-path", str(prof), "--what-if", WHAT_IF[1])
    params = StdioServerParameters(command=sys.executable, env=subprocess_env(),
                                   args=["-m", "torchprof_args", "mcp", "--root", str(job),
                                         "--cache-dir", str(tmp_path / "cache")])

    async def session() -> tuple[Any, Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            return (await client.call_tool("diagnose", {"path": "prof"}),
                    await client.call_tool("critical-path", {"path": "prof", "what_if": [WHAT_IF[1]]}))

    diagnosis, path = anyio.run(session)
    assert (diagnosis.structured_content, path.structured_content) == expected
    assert diagnosis.structured_content["findings"][0]["kind"] == "straggler"
    assert len(diagnosis.content) == 1  # nothing said on stderr: the sidecars were read


def test_the_command_refuses_a_root_that_is_no_folder_and_a_cache_under_a_root(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from torchprof_args.console import main

    assert main(["mcp", "--root", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == (f"torchprof mcp: error: --root {tmp_path / 'none'}: not a folder; "
                                       "give the folders the server may read\n")
    assert main(["mcp", "--root", str(tmp_path), "--cache-dir", str(tmp_path / "cache")]) == 2
    assert capsys.readouterr().err == (f"torchprof mcp: error: --cache-dir {tmp_path / 'cache'} lies under "
                                       "a root; the server writes nothing under its roots, give a folder "
                                       "outside them\n")
    assert not (tmp_path / "cache").exists()
    args = build_parser().parse_args(["mcp", "--root", str(tmp_path)])
    assert (args.max_file_mb, args.max_result_kb) == (2048, 48)
