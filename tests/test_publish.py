"""tools/publish_results.py: all of a run's published files, or none."""

from pathlib import Path

from conftest import load_script

REPO = Path(__file__).resolve().parents[1]
publish_results = load_script(REPO / "tools" / "publish_results.py")


def _summary(run: str) -> str:
    """A matched-count summary whose method beats random on every run but seed 3's."""
    loss, beats = (2.5, False) if run == "seed3_counts" else (2.0, True)
    return ("count\tarm\tfamily\tremoved\tloss\tdifference\tlow\thigh\trandom_p5\trandom_p95\tbeats_random\t"
            f"no_loss\tdraws\n36\tmichel\tmethod\t36\t{loss}\t0.2\t0.1\t0.3\t2.2\t3.0\t{beats}\tFalse\t\n"
            "36\trandom (median of draws)\trandom\t36\t2.6\t\t\t\t2.2\t3.0\t\t\t20\n")


def _fake_runs(root: Path) -> dict[str, Path]:
    runs = {"main": root / "results" / "exp", "control": root / "results" / "control",
            "seeds": root / "results" / "exp", "toolkits": root / "results" / "compare" / "toolkits",
            "smollm2": root / "results" / "smollm2_en", "minilm": root / "results" / "minilm_en",
            "smollm2_counts": root / "results" / "head_counts" / "smollm2",
            "minilm_counts": root / "results" / "head_counts" / "minilm",
            "smollm2_slow_gates_counts": root / "results" / "head_counts" / "smollm2_slow_gates",
            "minilm_slow_gates_counts": root / "results" / "head_counts" / "minilm_slow_gates",
            "smollm2_long_counts": root / "results" / "head_counts" / "smollm2_long",
            "smollm2_settled_counts": root / "results" / "head_counts" / "smollm2_settled",
            "minilm_settled_counts": root / "results" / "head_counts" / "minilm_settled",
            "copying_control": root / "results" / "head_counts" / "copying_control",
            "demo_counts": root / "results" / "demo", "main_counts": root / "results" / "exp",
            "seed2_counts": root / "results" / "exp_seed2", "seed3_counts": root / "results" / "exp_seed3"}
    for run, inside in publish_results.PUBLISHED.values():
        source = runs[run] / inside
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_bytes(f"{run}:{inside}".encode())
        if inside == "syntax/roles.csv":  # DERIVED reads these
            source.write_text("layer,head,role,sink_share\n0,0,sink,0.5\n0,1,none,0.1\n")
        if inside.endswith(".nll.tsv"):  # and these
            source.write_text("sentence\tnll\ttokens\n0\t2.0\t2\n1\t3.0\t3\n")
        if inside.endswith("head_counts_summary.tsv"):  # the translation seeds' table over seeds reads these
            source.write_text(_summary(run))
        if inside.endswith("gates.json"):
            source.write_text('{"retained": {"dec_self": 1}, "retained_paper_rule": {"dec_self": 0}, "heads": '
                              '[{"p_open": 0.5, "eval_gate": 0.4}, {"p_open": 0.0, "eval_gate": 0.0}]}')
    return runs


def test_a_missing_file_publishes_nothing(tmp_path):
    runs = _fake_runs(tmp_path)
    missing = runs["main"] / "prune" / "table2.md"
    missing.unlink()
    docs = tmp_path / "docs"
    lines = []
    assert publish_results.publish(runs, docs, log=lines.append) == 2
    assert not docs.exists()
    assert any(str(missing) in line for line in lines)


def test_every_file_is_copied_once(tmp_path):
    runs = _fake_runs(tmp_path)
    docs = tmp_path / "docs"
    (docs / "tables").mkdir(parents=True)
    (docs / "tables" / "table2.md").write_text("an older run's table\n")
    assert publish_results.publish(runs, docs, log=lambda _: None) == 0
    for published, (run, inside) in publish_results.PUBLISHED.items():
        assert (docs / published).read_bytes() == (runs[run] / inside).read_bytes()
    lines = []
    assert publish_results.publish(runs, docs, log=lines.append) == 0
    assert lines == [f"0 of {len(publish_results.PUBLISHED)} published files changed"]


def test_the_toolkits_comparison_is_published_only_when_asked_for_and_then_alone(tmp_path):
    runs = _fake_runs(tmp_path)
    toolkits = {name for name, (run, _) in publish_results.PUBLISHED.items() if run == "toolkits"}
    assert toolkits == {"tables/toolkits_comparison.md", "tables/toolkits_comparison.tsv"}
    docs = tmp_path / "docs"
    (runs["toolkits"] / "comparison.md").unlink()  # the toolkits' run is not done: the main run publishes all the same
    main_run = {run: runs[run] for run in ("main", "control", "seeds")}
    assert publish_results.publish(main_run, docs, log=lambda _: None) == 0
    assert not any((docs / name).exists() for name in toolkits)
    lines = []  # asked for alone, a missing file of its own publishes nothing
    assert publish_results.publish({"toolkits": runs["toolkits"]}, docs, log=lines.append) == 2
    assert "--configfile config/toolkits.yaml" in lines[0]  # the command that finishes that run
    assert not (docs / "tables/toolkits_comparison.tsv").exists()
    (runs["toolkits"] / "comparison.md").write_text("toolkits:comparison.md\n")
    (runs["main"] / "prune" / "table2.md").unlink()  # the main run's files are neither needed nor touched
    (docs / "results.md").write_text(PAGE + "<!-- published tables/toolkits_comparison.md -->\n"
                                     "<!-- end tables/toolkits_comparison.md -->\n")
    assert publish_results.publish({"toolkits": runs["toolkits"]}, docs, log=lambda _: None) == 0
    assert (docs / "tables/toolkits_comparison.md").read_text() == "toolkits:comparison.md\n"
    # the page's other tables keep their published files; the comparison is spliced in
    page = (docs / "results.md").read_text()
    assert "main:prune/table2.md\n" in page and "toolkits:comparison.md\n<!-- end tables/toolkits_comparison.md" in page


def test_seed_1_and_the_control_publish_while_the_seeds_train(tmp_path):
    runs = _fake_runs(tmp_path)
    seeds = {name for name, (run, _) in publish_results.PUBLISHED.items() if run == "seeds"}
    assert {"tables/seed_spread.md", "tables/seed_claims.md"} <= seeds
    assert all(inside.startswith("seeds/") for run, inside in publish_results.PUBLISHED.values() if run == "seeds")
    docs = tmp_path / "docs"
    (docs / "tables").mkdir(parents=True)
    (docs / "tables" / "seed_spread.md").write_text("the seeds of an older run\n")
    (runs["seeds"] / "seeds" / "claims.md").unlink()  # the seeds' grids still train
    (docs / "results.md").write_text(PAGE)
    lines = []  # with the seeds, a missing file of theirs publishes nothing
    assert publish_results.publish(runs, docs, log=lines.append) == 2
    assert any("seeds/claims.md" in line for line in lines)
    without = {run: runs[run] for run in ("main", "control")}
    assert publish_results.publish(without, docs, log=lambda _: None) == 0
    assert (docs / "tables" / "table2.md").read_text() == "main:prune/table2.md"
    assert (docs / "tables" / "seed_spread.md").read_text() == "the seeds of an older run\n"
    assert not (docs / "tables" / "seed_claims.md").exists()
    page = (docs / "results.md").read_text()  # the page keeps the seeds' published table
    assert "seed_spread.md -->\nthe seeds of an older run\n<!-- end" in page and "main:prune/table2.md" in page
    args = ["--results", str(runs["main"]), "--control", str(runs["control"]), "--docs", str(docs)]
    assert publish_results.main(args) == 2  # the command line: the seeds are wanted unless left out
    assert publish_results.main(args + ["--without-seeds"]) == 0
    assert (docs / "tables" / "seed_spread.md").read_text() == "the seeds of an older run\n"


def test_every_published_file_in_docs_comes_from_a_run():
    """A table or figure in docs/ that no run writes would outlive every republication."""
    shown = {str(p.relative_to(REPO / "docs")) for folder in ("tables", "figures")
             for p in (REPO / "docs" / folder).iterdir() if p.is_file()}
    made = set(publish_results.PUBLISHED) | publish_results.SCREENSHOTS | set(publish_results.DERIVED)
    made |= publish_results.RECORDED | {publish_results.PROVENANCE}
    assert shown <= made, sorted(shown - made)


PAGE = """# Results
Prose the publisher must keep.
<!-- published tables/table2.md -->
| an older run's table |
<!-- end tables/table2.md -->
More prose.
<!-- published tables/seed_spread.md -->
<!-- end tables/seed_spread.md -->
"""


def test_marked_tables_on_the_pages_are_replaced_by_the_runs(tmp_path):
    runs = _fake_runs(tmp_path)
    docs = tmp_path / "docs"
    (docs).mkdir()
    (docs / "results.md").write_text(PAGE)
    (tmp_path / "README.md").write_text("intro\n" + PAGE)
    assert publish_results.publish(runs, docs, log=lambda _: None) == 0
    spread = "<!-- published tables/seed_spread.md -->\n"
    expected = PAGE.replace("| an older run's table |\n", "main:prune/table2.md\n").replace(
        spread, spread + "seeds:seeds/spread.md\n")
    assert (docs / "results.md").read_text() == expected
    assert (tmp_path / "README.md").read_text() == "intro\n" + expected
    lines = []  # a second run changes nothing
    assert publish_results.publish(runs, docs, log=lines.append) == 0
    assert not any("updated" in line for line in lines)


def test_a_bad_marker_publishes_nothing(tmp_path):
    runs = _fake_runs(tmp_path)
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "README.md").write_text(PAGE)
    no_end = "<!-- end tables/table2.md -->"
    for bad, says in ((PAGE.replace(no_end + "\n", ""), f"line 3: no '{no_end}'"),
                      (PAGE.replace("tables/seed_spread.md", "tables/nowhere.md"), "line 7: 'tables/nowhere.md'")):
        (docs / "results.md").write_text(bad)
        try:
            publish_results.publish(runs, docs, log=lambda _: None)
        except publish_results.MarkerError as error:
            assert str(error).startswith(f"docs/results.md, {says}"), error
        else:
            raise AssertionError("a bad marker was accepted")
        assert not (docs / "tables").exists() and (tmp_path / "README.md").read_text() == PAGE
        assert (docs / "results.md").read_text() == bad


def test_the_pages_show_the_published_tables():
    """What docs/results.md and README.md show between markers is docs/tables' current file."""
    tables = {name: (REPO / "docs" / name).read_text() for name in publish_results.PUBLISHED
              if name.endswith(".md") and (REPO / "docs" / name).is_file()}
    for page in publish_results.PAGES:
        text = (REPO / page).read_text()
        assert publish_results.splice(page, text, tables) == text, f"{page}: run tools/publish_results.py"


compare_published = load_script(REPO / "tools" / "compare_published.py")


def _committed_tables(tmp_path: Path, tables: dict[str, str]) -> Path:
    """A git repository whose HEAD holds docs/tables/<name> with each text: an older publication."""
    import subprocess

    repo = tmp_path / "repo"
    (repo / "docs/tables").mkdir(parents=True)
    for name, text in tables.items():
        (repo / "docs/tables" / name).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "old"], check=True)
    return repo


def test_old_numbers_beside_new_from_git_and_a_run(tmp_path):
    import pandas as pd

    repo = _committed_tables(tmp_path, {"pruning.tsv": "setting\tlam\tbleu\tbleu_scratch\nall\t0.1\t34.68\t35.42\n"})
    (repo / "docs/tables/pruning.tsv").write_text("changed in the work tree, not at HEAD\n")
    old = compare_published.old_table("HEAD", "pruning.tsv", repo)
    assert old.to_dict("records") == [{"setting": "all", "lam": 0.1, "bleu": 34.68, "bleu_scratch": 35.42}]
    assert compare_published.old_table("HEAD", "nowhere.tsv", repo) is None
    new = pd.DataFrame({"setting": ["all", "all"], "lam": [0.0, 0.1], "bleu": [36.9, 35.0],
                        "bleu_scratch": [float("nan"), 35.1], "steps": [700, 700]})
    table = compare_published.compare(old, new, ["setting", "lam"], ["bleu", "bleu_scratch", "retained_enc_self"])
    lines = table.splitlines()
    assert lines[0] == ("| setting | lam | bleu old | bleu new | bleu change | bleu_scratch old | bleu_scratch new | "
                        "bleu_scratch change |")
    assert lines[2:] == ["| all | 0 | - | 36.9 | - | - | - | - |",
                         "| all | 0.1 | 34.68 | 35 | +0.32 | 35.42 | 35.1 | -0.32 |"]


def test_verdicts_old_beside_new_matched_on_the_finding(tmp_path):
    import pandas as pd

    repo = _committed_tables(tmp_path, {"pruning_claims.md": (
        "### x: the paper's pruning findings\n\n| finding (Voita et al., 2019) | this run | verdict |\n|---|---|---|\n"
        "| Heads go. | 3 of 4 | **holds** (3 of 4 significant) |\n"
        "| Layers matter. | 1 of 4 | **not resolved** (1 of 4 significant) |\n\nRules (...). **not** a row\n")})
    old = compare_published.old_verdicts("HEAD", repo=repo)
    assert old == {"Heads go.": "holds", "Layers matter.": "not resolved"}
    assert compare_published.old_verdicts("HEAD", "nowhere.md", repo) is None
    new = pd.DataFrame({"name": ["a", "c"], "paper": ["Heads go.", "Seeds agree."], "measured": ["", ""],
                        "verdict": ["not resolved", "holds"], "basis": ["1 of 4 significant", float("nan")]})
    lines = compare_published.compare_verdicts(old, new).splitlines()
    assert lines[2:] == ["| Heads go. | holds | not resolved | 1 of 4 significant |",
                         "| Layers matter. | not resolved | - | - |",
                         "| Seeds agree. | - | holds | - |"]


def test_old_beside_new_reads_each_table_where_the_publisher_copies_it_from(tmp_path):
    """compare_published's old file and new file are the pair publish_results copies, so a
    comparison never sets one run's table beside another's."""
    for title, (published, run, produced, _, _) in compare_published.TABLES.items():
        assert publish_results.PUBLISHED[f"tables/{published}"] == (run, produced), title
    for title, (published, run) in compare_published.VERDICTS.items():  # the claims tables too
        assert publish_results.PUBLISHED[f"tables/{published}"] == (run, "prune/claims.md"), title
    # a comma-separated table (the control's) is read as such from git
    repo = _committed_tables(tmp_path, {"control_planted_vs_found.csv": "function,layer,head,rate\nnsubj,2,1,0.648\n"})
    old = compare_published.old_table("HEAD", "control_planted_vs_found.csv", repo)
    assert old.to_dict("records") == [{"function": "nsubj", "layer": 2, "head": 1, "rate": 0.648}]
    new = tmp_path / "planted_vs_found.csv"
    new.write_text("function,layer,head,rate\nnsubj,2,1,0.7\n")
    lines = compare_published.compare(old, compare_published.read_table(new), ["function", "layer", "head"],
                                      ["rate"]).splitlines()
    assert lines[2:] == ["| nsubj | 2 | 1 | 0.648 | 0.7 | +0.05 |"]


def test_the_controls_verdicts_are_printed_after_the_experiments(tmp_path, capsys):
    import pandas as pd

    runs = {"main": tmp_path / "exp", "control": tmp_path / "control"}
    for run, verdict in (("main", "holds"), ("control", "does not hold")):
        (runs[run] / "prune").mkdir(parents=True)
        pd.DataFrame({"name": ["a"], "paper": [f"Heads go ({run})."], "measured": [""], "verdict": [verdict],
                      "basis": ["1 of 1"]}).to_csv(runs[run] / "prune" / "claims.tsv", sep="\t", index=False)
    assert compare_published.main(["--old", "HEAD", "--results", str(runs["main"]),
                                   "--control", str(runs["control"])]) == 0
    printed = capsys.readouterr().out
    main_at, control_at = printed.index("### verdicts ("), printed.index("### control verdicts (")
    assert main_at < control_at
    assert "| Heads go (main). | - | holds | 1 of 1 |" in printed[main_at:control_at]
    assert "| Heads go (control). | - | does not hold | 1 of 1 |" in printed[control_at:]


def test_publishing_records_each_files_config_and_the_commits_its_run_recorded(tmp_path):
    """docs/tables/provenance.tsv: a row per published file, with the config and experiment of its
    run and the first..last commits its jobs' provenance records name (those a folder deeper
    included); rows of runs not published this time are kept."""
    import json
    import subprocess

    runs = _fake_runs(tmp_path)
    commits = subprocess.run(["git", "-C", str(REPO), "log", "--format=%H", "-2", "fe7d90c"], capture_output=True,
                             text=True, check=True).stdout.split()  # fe7d90c and the commit before it
    for n, commit in enumerate(reversed(commits)):  # a rule with wildcards writes its record a folder deeper
        record = runs["main"] / "provenance" / ("head_counts/all.json" if n else f"job{n}.json")
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"rule": "x", "software": {"headcount_commit": commit}}))
    docs = tmp_path / "docs"
    main_run = {run: runs[run] for run in ("main", "control", "seeds")}
    assert publish_results.publish(main_run, docs, log=lambda _: None) == 0
    rows = {line.split("\t")[0]: line.split("\t") for line in (docs / "tables/provenance.tsv").read_text().splitlines()}
    assert rows["file"] == ["file", "config", "experiment", "commits"]
    first, last = commits[1][:7], commits[0][:7]
    assert rows["tables/table2.md"] == ["tables/table2.md", "config/config.yaml", "multi30k_en_de", f"{first}..{last}"]
    assert rows["tables/control_table1.md"][1:3] == ["config/config.yaml", "control"]
    assert rows["tables/control_table1.md"][3] == ""  # the control's jobs recorded no commit here
    assert "tables/toolkits_comparison.md" not in rows
    # a job run with changes not yet committed: the run's row says so
    modified = runs["main"] / "provenance" / "head_counts" / "enc.json"
    modified.write_text(json.dumps({"software": {"headcount_commit": commits[0], "headcount_modified": True}}))
    assert publish_results.publish(main_run, docs, log=lambda _: None) == 0
    rows = {line.split("\t")[0]: line.split("\t") for line in (docs / "tables/provenance.tsv").read_text().splitlines()}
    assert rows["tables/table2.md"][3] == f"{first}..{last} (uncommitted changes)"
    assert publish_results.publish({"toolkits": runs["toolkits"]}, docs, log=lambda _: None) == 0
    again = (docs / "tables/provenance.tsv").read_text()
    assert "tables/table2.md\tconfig/config.yaml\tmulti30k_en_de" in again
    assert "tables/toolkits_comparison.md\tconfig/toolkits.yaml" in again


def test_one_matched_count_run_publishes_alone(tmp_path):
    """--head-counts smollm2: SmolLM2's folder alone is needed and its files alone are copied."""
    runs = _fake_runs(tmp_path)
    chosen = publish_results.head_count_runs(["smollm2"], tmp_path / "results" / "head_counts")
    assert chosen == {"smollm2_counts": runs["smollm2_counts"]}
    # their runs are gone
    for other in ("minilm", "copying_control", "smollm2_slow_gates", "minilm_slow_gates", "smollm2_long",
                  "smollm2_settled", "minilm_settled"):
        for path in sorted((tmp_path / "results" / "head_counts" / other).rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
    docs = tmp_path / "docs"
    assert publish_results.publish(chosen, docs, log=lambda _: None) == 0
    copied = {str(p.relative_to(docs)) for p in docs.rglob("*") if p.is_file()} - {publish_results.PROVENANCE}
    assert copied == {name for name, (run, _) in publish_results.PUBLISHED.items() if run == "smollm2_counts"}
    assert {"tables/smollm2_targets.tsv", "tables/smollm2_captions_head_counts.md"} <= copied


def test_the_translation_seeds_publish_and_all_three_together_give_the_table_over_seeds(tmp_path):
    """--translation-counts 2: seed 2's folder alone; 1 2 3: every seed's files and the verdict over seeds."""
    runs = _fake_runs(tmp_path)
    docs = tmp_path / "docs"
    seed2 = {"seed2_counts": runs["seed2_counts"]}
    # the command line finds seed n beside --results, as the workflow names it (<exp>_seed<n>)
    assert publish_results.main(["--translation-counts", "2", "3", "--results", str(runs["main_counts"]),
                                 "--docs", str(docs), "--dry-run"]) == 0
    assert publish_results.publish(seed2, docs, log=lambda _: None) == 0
    published = (docs / "tables/multi30k_seed2_head_counts_enc.md").read_text()
    assert published == "seed2_counts:head_counts/enc/head_counts.md"
    assert not (docs / "tables/multi30k_head_counts_over_seeds_enc.tsv").exists()  # one seed: no table over seeds
    three = {"main_counts": runs["main_counts"], **seed2, "seed3_counts": runs["seed3_counts"]}
    assert publish_results.publish(three, docs, log=lambda _: None) == 0
    import pandas as pd

    over = pd.read_csv(docs / "tables/multi30k_head_counts_over_seeds_all.tsv", sep="\t").set_index("arm")
    assert over.loc["michel", "beats_random_seeds"] == 2 and not over.loc["michel", "held_beats_random"]
    assert over.loc["michel", "loss_mean"] == 2.166667  # (2.0 + 2.0 + 2.5) / 3, rounded as published
    provenance = (docs / publish_results.PROVENANCE).read_text()
    assert "tables/multi30k_seed3_targets_enc.tsv\tconfig/config.yaml\tmulti30k_en_de_seed3" in provenance
